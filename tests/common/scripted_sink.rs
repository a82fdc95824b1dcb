//! [`Scripted`]: a sink effect whose calls and checks end as scripted, recording each in
//! order, so that every row of the engine's rule for calls without an answer (and of the
//! reconciler's) is driven exactly. The real sinks' answers are proven against real
//! receivers in their own tests.

use std::collections::VecDeque;
use std::sync::Arc;

use dedupd::sinks::{CheckAnswer, SinkEffect, SinkError, SinkOutput, SinkRequest};
use parking_lot::Mutex;
use serde_json::json;

/// How one scripted call ends.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    /// Answered 2xx.
    Ok,
    /// Sent, never answered (a timeout after the request left).
    Lost,
    /// Answered with a transient failure (a 503).
    Busy,
    /// Refused before the request left (connection refused).
    Refused,
    /// Sent, and not answered within half a second (a slow receiver, then a timeout): a
    /// call under way long enough to be let go meanwhile.
    Slow,
}

/// A sink whose calls and checks end as scripted, recording each in order.
pub struct Scripted {
    calls: Mutex<VecDeque<Call>>,
    checks: Mutex<VecDeque<CheckAnswer>>,
    log: Mutex<Vec<String>>,
}

impl Scripted {
    pub fn new(calls: &[Call], checks: Vec<CheckAnswer>) -> Arc<Scripted> {
        Arc::new(Scripted {
            calls: Mutex::new(calls.iter().copied().collect()),
            checks: Mutex::new(checks.into()),
            log: Mutex::new(Vec::new()),
        })
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().clone()
    }
}

#[async_trait::async_trait]
impl SinkEffect for Scripted {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let call = self.calls.lock().pop_front().expect("a scripted call left");
        self.log.lock().push(format!("call {call:?}"));
        let transient = |message: &str| Err(SinkError::Transient { message: message.into(), retry_after: None });
        match call {
            Call::Ok => {
                request.answered();
                Ok(json!({"paid": request.key()}))
            }
            Call::Lost => transient("timed out waiting for the answer"),
            Call::Slow => {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                transient("timed out waiting for the answer")
            }
            Call::Busy => {
                request.answered();
                transient("HTTP 503")
            }
            Call::Refused => {
                request.never_sent();
                transient("connection refused")
            }
        }
    }

    async fn check(&self, _request: SinkRequest<'_>) -> CheckAnswer {
        let answer = self.checks.lock().pop_front().expect("a scripted check left");
        self.log.lock().push(format!("check {}", answer.label()));
        answer
    }
}
