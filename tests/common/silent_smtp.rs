//! An SMTP server on 127.0.0.1 that takes a message and never answers its end: the case a
//! sink cannot tell apart from a delivery whose reply was lost. It speaks just enough SMTP
//! (220 greeting, 250 to EHLO, MAIL and RCPT, 354 to DATA), reads the message through the
//! final `.` line, counts it, and then holds the connection open without a word.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The server; it stops with the test's runtime.
pub struct SilentSmtp {
    /// Its port on 127.0.0.1.
    pub port: u16,
    messages: Arc<AtomicUsize>,
}

impl SilentSmtp {
    /// Starts it on a free port of 127.0.0.1.
    pub async fn start() -> SilentSmtp {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("local address").port();
        let messages = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&messages);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&counted)));
            }
        });
        SilentSmtp { port, messages }
    }

    /// Messages read through their final `.` line so far.
    pub fn messages(&self) -> usize {
        self.messages.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` messages were read.
    pub async fn wait_for(&self, n: usize, bound: Duration) {
        let deadline = Instant::now() + bound;
        while self.messages() < n {
            assert!(Instant::now() < deadline, "{} of {n} messages arrived", self.messages());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One connection: the dialogue up to the message's end, then silence until the client
/// closes it.
async fn serve(stream: TcpStream, messages: Arc<AtomicUsize>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    if write.write_all(b"220 silent.test ESMTP\r\n").await.is_err() {
        return;
    }
    let mut in_data = false;
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if in_data {
            if line == ".\r\n" {
                messages.fetch_add(1, Ordering::SeqCst);
                // No reply: read on until the client closes, and answer nothing.
                let mut rest = Vec::new();
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut lines, &mut rest).await;
                return;
            }
            continue;
        }
        let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
        let reply: &[u8] = match verb.as_str() {
            "EHLO" | "HELO" => b"250 silent.test\r\n",
            "MAIL" | "RCPT" | "RSET" | "NOOP" => b"250 OK\r\n",
            "DATA" => {
                in_data = true;
                b"354 go ahead\r\n"
            }
            "QUIT" => b"221 bye\r\n",
            _ => b"500 unknown command\r\n",
        };
        if write.write_all(reply).await.is_err() {
            return;
        }
    }
}
