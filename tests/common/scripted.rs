//! [`ScriptedReceiver`]: an HTTP receiver on 127.0.0.1 whose answers are scripted per
//! `Idempotency-Key` (e.g. 400 for one key, 503 then 200 for another), recording every
//! request with the status it answered, so a test can compare what dedupd counted
//! (`sink_requests_total{status}`, outcomes) with what the receiver really answered.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One request the receiver answered.
#[derive(Debug, Clone)]
pub struct Answered {
    /// `Idempotency-Key`, if sent.
    pub key: Option<String>,
    /// The status it answered.
    pub status: u16,
    /// The request body.
    pub body: Bytes,
}

#[derive(Clone, Default)]
struct Script {
    /// Statuses still to answer per key, in order; 200 once a key's queue is empty.
    pending: Arc<Mutex<HashMap<String, VecDeque<u16>>>>,
    answered: Arc<Mutex<Vec<Answered>>>,
}

async fn answer(
    State(s): State<Script>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let status = key.as_ref().and_then(|k| s.pending.lock().get_mut(k).and_then(VecDeque::pop_front)).unwrap_or(200);
    s.answered.lock().push(Answered { key, status, body });
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let reply = if code.is_success() {
        serde_json::json!({"accepted": true})
    } else {
        serde_json::json!({"error": format!("scripted {status}")})
    };
    (code, axum::Json(reply))
}

/// An HTTP receiver answering POSTs on any path as scripted per key (200 otherwise).
pub struct ScriptedReceiver {
    /// Where it listens.
    pub addr: SocketAddr,
    script: Script,
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl ScriptedReceiver {
    /// Starts it on 127.0.0.1:0; `script` gives, per key, the statuses of its first requests.
    pub async fn start(script: &[(&str, &[u16])]) -> ScriptedReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        let state = Script::default();
        state.pending.lock().extend(script.iter().map(|(k, s)| (k.to_string(), s.iter().copied().collect())));
        let app = axum::Router::new().fallback(axum::routing::post(answer)).with_state(state.clone());
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await })
        };
        ScriptedReceiver { addr, script: state, stop, task }
    }

    /// The URL of `path` (starting with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request answered so far, in arrival order.
    pub fn answered(&self) -> Vec<Answered> {
        self.script.answered.lock().clone()
    }

    /// Stops it.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}
