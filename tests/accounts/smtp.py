"""A real SMTP server on loopback (aiosmtpd) that keeps what it receives, for the tests that
follow a mail from Sluice to the person reading it."""

from __future__ import annotations

import email
import logging
import re
import time
from email.message import Message

from aiosmtpd.controller import Controller

from devstack.stack import free_port

logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every SMTP line


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 Message accepted for delivery"

    def wait_for(self, to: str, *, subject: str = "", timeout: float = 20) -> Message:
        """The newest mail to `to` (with `subject` in its subject), waiting for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in reversed(self.messages):
                if to in message["To"] and subject in message["Subject"]:
                    return message
            time.sleep(0.1)
        raise AssertionError(f"no mail to {to} about {subject!r} within {timeout:.0f}s")

    def count_to(self, to: str) -> int:
        return sum(to in message["To"] for message in self.messages)


def body_of(message: Message) -> str:
    part = message.get_body(("plain",)) if hasattr(message, "get_body") else None
    if part is None:
        for part in message.walk():
            if part.get_content_type() == "text/plain":
                break
    return part.get_payload(decode=True).decode()


def link_in(message: Message, path: str) -> str:
    """The first link in the mail whose path starts with `path`."""
    found = re.search(r"https?://[^\s\"'<>]+" + re.escape(path) + r"[^\s\"'<>]*", body_of(message))
    assert found, body_of(message)
    return found[0]


class SmtpServer:
    def __init__(self) -> None:
        self.inbox = Inbox()
        self.port = free_port()
        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> SmtpServer:
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"
