#!/usr/bin/env python3
"""A real SMTP server for tidemark's tests (aiosmtpd, pinned in requirements.txt).

    server.py DIR [OWNER_PID]

Listens on 127.0.0.1 on a free port, writes the port to DIR/port and its pid to DIR/pid, and
appends every accepted message to DIR/messages.jsonl as one JSON object per line:
{"mail_from", "rcpt_tos", "message_id", "subject", "x_mailer", "data"}. With OWNER_PID it exits once that
process is gone, so a test that dies never leaves it behind.

Behaviour is scripted by the recipient's local part, so one server serves every case:
  tempfail<N>-...@   451 at RCPT the first N times that address is tried, then accepted
  permfail-...@      550 at RCPT (a rejected address)
  hang-...@          never answers DATA (the client's timeout is what ends it)
  hang1-...@         never answers the first DATA for that address; later ones are accepted
  drop-...@          closes the connection at RCPT
Anything else is accepted.
"""

import asyncio
import json
import os
import re
import socket
import sys
from email import message_from_bytes

from aiosmtpd.controller import Controller

DIR = sys.argv[1]
OWNER = int(sys.argv[2]) if len(sys.argv) > 2 else None
tries: dict[str, int] = {}
data_tries: dict[str, int] = {}


class Handler:
    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split("@", 1)[0].lower()
        tries[address] = tries.get(address, 0) + 1
        m = re.match(r"tempfail(\d+)-", local)
        if m and tries[address] <= int(m.group(1)):
            return "451 4.3.0 try again later (scripted)"
        if local.startswith("permfail-"):
            return "550 5.1.1 no such user (scripted)"
        if local.startswith("drop-"):
            session.transport.close()
            return "421 closing (scripted)"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if any(a.split("@", 1)[0].lower().startswith("hang-") for a in envelope.rcpt_tos):
            await asyncio.sleep(3600)
        for a in envelope.rcpt_tos:
            if a.split("@", 1)[0].lower().startswith("hang1-"):
                data_tries[a] = data_tries.get(a, 0) + 1
                if data_tries[a] == 1:
                    await asyncio.sleep(3600)
        msg = message_from_bytes(envelope.content)
        record = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "message_id": msg.get("Message-ID"),
            "subject": msg.get("Subject"),
            "x_mailer": msg.get("X-Mailer"),
            "data": envelope.content.decode("utf-8", "replace"),
        }
        with open(os.path.join(DIR, "messages.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        return "250 Message accepted"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def main():
    port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    with open(os.path.join(DIR, "pid"), "w") as f:
        f.write(str(os.getpid()))
    with open(os.path.join(DIR, "port.tmp"), "w") as f:
        f.write(str(port))
    os.replace(os.path.join(DIR, "port.tmp"), os.path.join(DIR, "port"))
    while True:
        await asyncio.sleep(0.5)
        if OWNER is not None:
            try:
                os.kill(OWNER, 0)
            except OSError:
                controller.stop()
                return


if __name__ == "__main__":
    asyncio.run(main())
