//! A real SMTP server on loopback for the `smtp` sink's tests: Python's aiosmtpd running
//! tests/support/smtp_server.py, which stores every accepted message as a file and answers
//! 451 / 550 for the magic recipients `tempfail@…` / `reject@…`.
//!
//! aiosmtpd comes from PyPI (`scripts/test` installs it). When it is missing the tests skip,
//! unless `DEDUPD_REQUIRE_KAFKA=1` (the CI flag), where they fail saying so.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound on starting the server and on waiting for what it stores.
const BOUND: Duration = Duration::from_secs(20);

/// The recording server; killed on drop.
pub struct SmtpServer {
    child: Child,
    dir: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

/// One message as the server received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub mail_from: String,
    pub rcpt_tos: Vec<String>,
    /// The user that logged in, if any.
    pub auth_login: Option<String>,
    /// The raw message (headers and body, CRLF line ends).
    pub data: String,
}

impl Received {
    /// The first header `name` (case-insensitive), unfolded.
    pub fn header(&self, name: &str) -> Option<String> {
        let head = self.data.split("\r\n\r\n").next().unwrap_or("");
        let mut unfolded: Vec<String> = Vec::new();
        for line in head.split("\r\n") {
            match (line.starts_with([' ', '\t']), unfolded.last_mut()) {
                (true, Some(last)) => last.push_str(line),
                _ => unfolded.push(line.to_string()),
            }
        }
        unfolded.iter().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }

    /// Everything after the header block.
    pub fn body(&self) -> &str {
        self.data.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_server.py")
}

fn aiosmtpd_installed() -> bool {
    Command::new("python3")
        .args(["-c", "import aiosmtpd"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// How the server secures connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerTls {
    /// No TLS.
    Plain,
    /// Offers STARTTLS and requires it before MAIL.
    Starttls,
    /// TLS from the first byte.
    Implicit,
}

/// The test CA that signed the server's certificate (for `localhost` and `127.0.0.1`).
pub fn test_ca() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/tls/ca.pem")
}

impl SmtpServer {
    /// Starts a plain-text server; see [`SmtpServer::start_with`].
    pub fn start() -> Option<SmtpServer> {
        SmtpServer::start_with(ServerTls::Plain)
    }

    /// Starts the server and waits until it accepts connections; `None` (test skipped)
    /// when aiosmtpd is missing and not required.
    pub fn start_with(tls: ServerTls) -> Option<SmtpServer> {
        SmtpServer::start_full(tls, None)
    }

    /// Like [`SmtpServer::start_with`]; `env_password` also accepts user `envuser` with it.
    pub fn start_full(tls: ServerTls, env_password: Option<&str>) -> Option<SmtpServer> {
        SmtpServer::start_inner(tls, env_password, None)
    }

    /// A plain-text server that answers each message `delay_ms` (ms, uniform) after it
    /// stored it, so that a client killed in between has sent a message it never saw
    /// accepted.
    pub fn start_slow(delay_ms: (u64, u64)) -> Option<SmtpServer> {
        SmtpServer::start_inner(ServerTls::Plain, None, Some(delay_ms))
    }

    fn start_inner(
        tls: ServerTls,
        env_password: Option<&str>,
        reply_delay_ms: Option<(u64, u64)>,
    ) -> Option<SmtpServer> {
        if !aiosmtpd_installed() {
            if std::env::var("DEDUPD_REQUIRE_KAFKA").is_ok_and(|v| v == "1") {
                panic!("python3 with aiosmtpd is required (DEDUPD_REQUIRE_KAFKA=1): python3 -m pip install aiosmtpd");
            }
            eprintln!("SKIPPED: python3 with aiosmtpd is not installed (python3 -m pip install aiosmtpd)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let tls_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/tls");
        let mode: Vec<PathBuf> = match tls {
            ServerTls::Plain => vec!["plain".into()],
            ServerTls::Starttls => vec!["starttls".into(), tls_dir.join("server.pem"), tls_dir.join("server.key")],
            ServerTls::Implicit => vec!["tls".into(), tls_dir.join("server.pem"), tls_dir.join("server.key")],
        };
        let mut child = Command::new("python3")
            .arg(script())
            .arg(dir.path())
            .args(&mode)
            .envs(env_password.map(|p| ("DEDUPD_TEST_SMTP_ENV_PASSWORD", p.to_string())))
            .envs(reply_delay_ms.map(|(lo, hi)| ("DEDUPD_TEST_SMTP_REPLY_DELAY_MS", format!("{lo}-{hi}"))))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("python3 starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(BOUND).expect("the SMTP server reports its port in time");
        let port: u16 = line
            .strip_prefix("LISTENING ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from the SMTP server: {line:?}"));
        let server = SmtpServer { child, dir, port };
        let deadline = Instant::now() + BOUND;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the SMTP server does not accept connections on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    /// Every message stored so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.received_numbered().into_iter().map(|(_, r)| r).collect()
    }

    /// Every message stored so far with its number (the `queued as N` of the server's
    /// reply), in arrival order.
    pub fn received_numbered(&self) -> Vec<(u64, Received)> {
        let mut numbered: Vec<(u64, Received)> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| {
                let path = e.unwrap().path();
                let n: u64 = path.file_name()?.to_str()?.strip_suffix(".json")?.parse().ok()?;
                let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                let rcpt_tos =
                    v["rcpt_tos"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_string()).collect();
                Some((
                    n,
                    Received {
                        mail_from: v["mail_from"].as_str().unwrap().to_string(),
                        rcpt_tos,
                        auth_login: v["auth_login"].as_str().map(str::to_string),
                        data: v["data"].as_str().unwrap().to_string(),
                    },
                ))
            })
            .collect();
        numbered.sort_by_key(|(n, _)| *n);
        numbered
    }

    /// Waits (bounded) until at least `n` messages are stored, and returns them all.
    pub fn wait_for(&self, n: usize) -> Vec<Received> {
        let deadline = Instant::now() + BOUND;
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(Instant::now() < deadline, "{} of {n} messages arrived", got.len());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
