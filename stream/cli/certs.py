"""`streamctl certs create-ca|issue`: a cluster's CA and the certificates it issues to bookies,
clients and services (docs/security.md). Keys are written 0600."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stream.cli.output import print_json, supports_json, wants_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `certs create-ca|issue` to `streamctl`."""
    certs = subparsers.add_parser("certs")
    sub = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    ca = sub.add_parser("create-ca", help="create a CA (ca.crt, ca.key) in a directory")
    ca.add_argument("--dir", required=True, type=Path, help="where to write the CA")
    ca.add_argument("--name", default="streamkeeper-ca", help="the CA's common name")
    ca.add_argument("--days", type=int, default=3650, help="validity (default 3650)")
    ca.add_argument("--force", action="store_true", help="replace an existing CA")
    supports_json(ca)
    ca.set_defaults(handler=_create_ca)

    issue = sub.add_parser(
        "issue",
        help="issue NAME.crt and NAME.key signed by the CA in --dir",
        description="The principal is NAME (the subject's common name); the role goes in a SAN "
        "URI streamkeeper:role:ROLE. Every certificate serves localhost and 127.0.0.1 (plus "
        "--host) and works as a client certificate too; give bookies the role 'service' (they "
        "repair each other).",
    )
    issue.add_argument("name", help="the principal (common name), also the file names")
    issue.add_argument("--role", required=True, choices=("reader", "writer", "service", "admin"))
    issue.add_argument("--dir", required=True, type=Path, help="the CA's directory")
    issue.add_argument(
        "--host", action="append", default=[], help="another DNS name or IP it serves"
    )
    issue.add_argument("--days", type=int, default=825, help="validity (default 825)")
    issue.add_argument("--force", action="store_true", help="replace existing files")
    supports_json(issue)
    issue.set_defaults(handler=_issue)


def _create_ca(args: argparse.Namespace) -> int:
    from stream.security.certs import create_ca

    cert, key = create_ca(args.dir, name=args.name, days=args.days, force=args.force)
    if wants_json(args):
        print_json({"ca_file": str(cert), "key_file": str(key)})
    else:
        sys.stdout.write(f"CA certificate: {cert}\nCA key:         {key} (keep it offline)\n")
    return 0


def _issue(args: argparse.Namespace) -> int:
    from stream.security.certs import issue
    from stream.security.roles import Role

    issued = issue(
        args.dir,
        args.name,
        Role.parse(args.role),
        hosts=tuple(args.host),
        days=args.days,
        force=args.force,
    )
    if wants_json(args):
        print_json(
            {
                "name": issued.name,
                "role": issued.role.label,
                "cert_file": str(issued.cert_file),
                "key_file": str(issued.key_file),
                "hosts": list(issued.hosts),
                "not_after": issued.not_after.isoformat(),
            }
        )
    else:
        sys.stdout.write(
            f"{issued.name} ({issued.role.label}): {issued.cert_file}, {issued.key_file}\n"
            f"serves {', '.join(issued.hosts)}; valid until {issued.not_after:%Y-%m-%d}\n"
        )
    return 0
