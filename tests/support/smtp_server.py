#!/usr/bin/env python3
"""A recording SMTP server for tests/sinks/smtp_sink.rs (aiosmtpd, loopback only).

Usage: smtp_server.py OUT_DIR [plain|starttls|tls CERT KEY]

plain (default): no TLS. starttls: offers STARTTLS and requires it before MAIL. tls: TLS
from the first byte (implicit TLS). CERT and KEY are the server's PEM files.

Listens on 127.0.0.1 on a port the OS picks and prints "LISTENING <port>" on stdout once
it accepts connections. Every message it accepts is stored as OUT_DIR/<n>.json:
{"mail_from": ..., "rcpt_tos": [...], "auth_login": <user or null>, "data": <raw message>}
written to a temporary name and renamed, so a reader never sees half a file.

Magic recipients (the local part decides; the message is then not stored):
  tempfail@...  -> 451 4.3.0 at RCPT (transient)
  reject@...    -> 550 5.1.1 at RCPT (permanent)

Logins: user "dedupd" with password "s3cret" is accepted, and user "envuser" with the
password in this process's DEDUPD_TEST_SMTP_ENV_PASSWORD when that is set; any other login
is refused with 535.
DEDUPD_TEST_SMTP_REPLY_DELAY_MS=LO-HI: answer each message LO..HI ms (uniform) after it was
stored (so that a client killed in between sent a message it never saw accepted).
The server exits when its stdin closes (the test dropped it) or on SIGTERM.
"""

import asyncio
import itertools
import json
import os
import random
import signal
import ssl
import sys

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword


class Recorder:
    def __init__(self, out_dir, reply_delay_ms=None):
        self.out_dir = out_dir
        self.counter = itertools.count(1)
        self.reply_delay_ms = reply_delay_ms

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split("@", 1)[0].lower()
        if local == "tempfail":
            return "451 4.3.0 mailbox busy, try again later"
        if local == "reject":
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        n = next(self.counter)
        login = getattr(session, "auth_data", None)
        if isinstance(login, bytes):
            login = login.decode("utf-8", "replace")
        record = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "auth_login": login,
            "data": envelope.original_content.decode("utf-8", "replace"),
        }
        tmp = os.path.join(self.out_dir, f".{n}.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.rename(tmp, os.path.join(self.out_dir, f"{n}.json"))
        if self.reply_delay_ms:
            await asyncio.sleep(random.uniform(*self.reply_delay_ms) / 1000)
        return f"250 2.0.0 OK queued as {n}"


ACCOUNTS = {b"dedupd": b"s3cret"}
if os.environ.get("DEDUPD_TEST_SMTP_ENV_PASSWORD"):
    ACCOUNTS[b"envuser"] = os.environ["DEDUPD_TEST_SMTP_ENV_PASSWORD"].encode()


def authenticate(server, session, envelope, mechanism, auth_data):
    ok = isinstance(auth_data, LoginPassword) and ACCOUNTS.get(auth_data.login) == auth_data.password
    return AuthResult(success=ok, auth_data=auth_data.login if ok else None, handled=False)


async def main(out_dir, mode, cert, key):
    delay = os.environ.get("DEDUPD_TEST_SMTP_REPLY_DELAY_MS")
    handler = Recorder(out_dir, tuple(float(x) for x in delay.split("-", 1)) if delay else None)
    loop = asyncio.get_running_loop()
    context = None
    if mode != "plain":
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)

    def factory():
        return SMTP(
            handler,
            hostname="dedupd-test",
            authenticator=authenticate,
            auth_require_tls=False,
            auth_exclude_mechanism=["CRAM-MD5"],
            require_starttls=mode == "starttls",
            tls_context=context if mode == "starttls" else None,
        )

    implicit = context if mode == "tls" else None
    server = await loop.create_server(factory, host="127.0.0.1", port=0, ssl=implicit)
    port = server.sockets[0].getsockname()[1]
    print(f"LISTENING {port}", flush=True)

    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.buffer.read1(4096) else None)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    mode = sys.argv[2] if len(sys.argv) > 2 else "plain"
    if mode not in ("plain", "starttls", "tls"):
        sys.exit(f"unknown mode {mode!r}")
    cert, key = (sys.argv[3], sys.argv[4]) if mode != "plain" else (None, None)
    asyncio.run(main(sys.argv[1], mode, cert, key))
