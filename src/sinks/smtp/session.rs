//! One message over one SMTP session, driven step by step with lettre's connection (not its
//! transport), so that a failure says how far the call got (docs/sinks.md, `smtp`):
//!
//! - the **session** (TCP connect, TLS, the greeting, EHLO, STARTTLS, AUTH, or a pooled
//!   connection's NOOP): no mail transaction has begun, so no byte of the message has left
//!   and the relay cannot have delivered anything;
//! - the **transaction** (MAIL FROM, RCPT TO, DATA, the message and its end): from the first
//!   byte of MAIL FROM on, a failure without a reply may follow a delivery (the classic case:
//!   the message's end was written and the reply to it never came).
//!
//! lettre's own transport cannot tell these apart (its errors do not say at which step they
//! happened) and, on tokio, bounds only the TCP connect by its timeout: a relay that goes
//! silent after DATA would hold the call for ever. Here every step is bounded by `timeout`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lettre::Message;
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Response;

use crate::sinks::CallAnswer;

/// Most idle connections kept for reuse (lettre's pool default).
const MAX_IDLE: usize = 10;
/// An idle connection older than this is closed instead of reused (lettre's pool default).
const IDLE_FOR: Duration = Duration::from_secs(60);

/// How the connection to the relay is secured, with the TLS settings.
pub(super) enum Secure {
    /// Plain text.
    None,
    /// Plain connect, then STARTTLS, which the relay must offer.
    Starttls(TlsParameters),
    /// TLS from the first byte.
    Implicit(TlsParameters),
}

/// A relay and the connections to it kept for reuse.
pub(super) struct Relay {
    host: String,
    port: u16,
    secure: Secure,
    hello: ClientId,
    credentials: Option<Credentials>,
    /// Bound on each step.
    timeout: Duration,
    idle: Mutex<Vec<(AsyncSmtpConnection, Instant)>>,
}

/// How far a failed call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reached {
    /// Setting up the session: nothing of the message left.
    Session,
    /// In the mail transaction: the message may have been delivered.
    Transaction,
}

/// Why a call failed.
#[derive(Debug)]
pub(super) enum Cause {
    /// What lettre said: a reply with a 4xx/5xx code, a connection, TLS or I/O error, a
    /// malformed reply, or a relay that cannot take the message as configured.
    Smtp(lettre::transport::smtp::Error),
    /// No reply to the step within the timeout.
    TimedOut { step: &'static str, after: Duration },
    /// The relay lacks an extension the message needs (SMTPUTF8, 8BITMIME); found before the
    /// transaction began.
    Unsupported(&'static str),
}

/// A failed call: how far it got and why.
#[derive(Debug)]
pub(super) struct Failed {
    pub(super) reached: Reached,
    pub(super) cause: Cause,
}

impl Failed {
    /// What the relay may hold of the call: a reply with a code answered it, at any step; a
    /// failure before the transaction certainly sent nothing; anything else may have
    /// delivered the message.
    pub(super) fn answer(&self) -> CallAnswer {
        match (&self.cause, self.reached) {
            (Cause::Smtp(e), _) if e.status().is_some() => CallAnswer::Answered,
            (_, Reached::Session) => CallAnswer::NeverSent,
            (_, Reached::Transaction) => CallAnswer::Maybe,
        }
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cause {
            Cause::Smtp(e) => write!(f, "{e}"),
            Cause::TimedOut { step, after } => {
                write!(f, "timed out: no reply to {step} within {}", humantime::format_duration(*after))
            }
            Cause::Unsupported(what) => write!(f, "the relay does not support {what}, which the message needs"),
        }
    }
}

/// Runs `step` within `timeout`; a failure or timeout is `Failed` at `reached`.
async fn bounded<T>(
    timeout: Duration,
    reached: Reached,
    name: &'static str,
    step: impl Future<Output = Result<T, lettre::transport::smtp::Error>>,
) -> Result<T, Failed> {
    match tokio::time::timeout(timeout, step).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Failed { reached, cause: Cause::Smtp(e) }),
        Err(_) => Err(Failed { reached, cause: Cause::TimedOut { step: name, after: timeout } }),
    }
}

impl Relay {
    /// A relay at `host:port`, no connection open yet.
    pub(super) fn new(
        host: String,
        port: u16,
        secure: Secure,
        hello: ClientId,
        credentials: Option<Credentials>,
        timeout: Duration,
    ) -> Relay {
        Relay { host, port, secure, hello, credentials, timeout, idle: Mutex::new(Vec::new()) }
    }

    /// Sends `message`: the relay's reply to its end, or how far the call got and why.
    pub(super) async fn send(&self, message: &Message) -> Result<Response, Failed> {
        let mut conn = self.session().await?;
        let sent = self.transaction(&mut conn, message).await;
        // Only a connection whose transaction ended with a positive reply is known to be
        // ready for the next one; any other is dropped (closing it).
        if sent.is_ok() {
            self.park(conn);
        }
        sent
    }

    /// A connection ready for a transaction: a pooled one that still answers NOOP, or a
    /// new one.
    async fn session(&self) -> Result<AsyncSmtpConnection, Failed> {
        while let Some(mut conn) = self.unpark() {
            if tokio::time::timeout(self.timeout, conn.test_connected()).await.unwrap_or(false) {
                return Ok(conn);
            }
        }
        let t = self.timeout;
        let implicit = match &self.secure {
            Secure::Implicit(params) => Some(params.clone()),
            Secure::None | Secure::Starttls(_) => None,
        };
        let connect =
            AsyncSmtpConnection::connect_tokio1((self.host.as_str(), self.port), Some(t), &self.hello, implicit, None);
        let mut conn = bounded(t, Reached::Session, "connecting (TCP, TLS, greeting, EHLO)", connect).await?;
        if let Secure::Starttls(params) = &self.secure {
            bounded(t, Reached::Session, "STARTTLS", conn.starttls(params.clone(), &self.hello)).await?;
        }
        if let Some(credentials) = &self.credentials {
            bounded(t, Reached::Session, "AUTH", conn.auth(DEFAULT_MECHANISMS, credentials)).await?;
        }
        Ok(conn)
    }

    /// MAIL FROM, RCPT TO for each recipient, DATA and the message, each step bounded.
    async fn transaction(&self, conn: &mut AsyncSmtpConnection, message: &Message) -> Result<Response, Failed> {
        let envelope = message.envelope();
        let body = message.formatted();
        let mut options = Vec::new();
        // As lettre's own `send`: ask for the extensions the message needs, and refuse it
        // before the transaction when the relay lacks them.
        if envelope.from().into_iter().chain(envelope.to()).any(|a| !AsRef::<str>::as_ref(a).is_ascii()) {
            if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
                return Err(Failed { reached: Reached::Session, cause: Cause::Unsupported("SMTPUTF8") });
            }
            options.push(MailParameter::SmtpUtfEight);
        }
        if !body.is_ascii() {
            if !conn.server_info().supports_feature(Extension::EightBitMime) {
                return Err(Failed { reached: Reached::Session, cause: Cause::Unsupported("8BITMIME") });
            }
            options.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        let (t, at) = (self.timeout, Reached::Transaction);
        bounded(t, at, "MAIL FROM", conn.command(Mail::new(envelope.from().cloned(), options))).await?;
        for to in envelope.to() {
            bounded(t, at, "RCPT TO", conn.command(Rcpt::new(to.clone(), Vec::new()))).await?;
        }
        bounded(t, at, "DATA", conn.command(Data)).await?;
        bounded(t, at, "the end of the message", conn.message(&body)).await
    }

    /// The most recently parked connection that is not too old; older ones are dropped.
    fn unpark(&self) -> Option<AsyncSmtpConnection> {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < IDLE_FOR {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next call, unless enough are kept already.
    fn park(&self, conn: AsyncSmtpConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failure_before_the_transaction_was_never_sent() {
        let failed = |reached, cause| Failed { reached, cause };
        let silent = || Cause::TimedOut { step: "the end of the message", after: Duration::from_secs(1) };
        assert_eq!(failed(Reached::Session, silent()).answer(), CallAnswer::NeverSent);
        assert_eq!(failed(Reached::Transaction, silent()).answer(), CallAnswer::Maybe);
        let unsupported = failed(Reached::Session, Cause::Unsupported("SMTPUTF8"));
        assert_eq!(unsupported.answer(), CallAnswer::NeverSent);
        assert_eq!(
            failed(Reached::Transaction, silent()).to_string(),
            "timed out: no reply to the end of the message within 1s"
        );
    }
}
