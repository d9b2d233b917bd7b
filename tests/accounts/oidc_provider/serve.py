"""Runs the test provider: `python -m tests.accounts.oidc_provider.serve PORT STATE_DIR
CONFIG_JSON`, where the config names the client (id, secret, redirect URI) and the users
(username, password, email, verified). Prints "ready" once it serves."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    port, state, config = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    os.environ["OIDC_PROVIDER_STATE"] = str(state)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.accounts.oidc_provider.settings"
    if not (state / "rsa.pem").exists():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        (state / "rsa.pem").write_bytes(pem)

    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0, interactive=False)
    for person in config["users"]:
        user, _ = User.objects.get_or_create(username=person["username"])
        user.email = person["email"]
        user.last_name = "" if person.get("verified", True) else "unverified"
        user.set_password(person["password"])
        user.save()
    client = config["client"]
    Application.objects.update_or_create(
        client_id=client["id"],
        defaults={
            "name": "Sluice",
            "client_secret": client["secret"],
            "hash_client_secret": False,
            "client_type": Application.CLIENT_CONFIDENTIAL,
            "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
            "redirect_uris": client["redirect_uri"],
            "algorithm": Application.RS256_ALGORITHM,
            "skip_authorization": True,
        },
    )
    print("ready", flush=True)
    call_command("runserver", f"127.0.0.1:{port}", use_reloader=False, use_threading=True)


if __name__ == "__main__":
    main()
