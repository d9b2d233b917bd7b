from __future__ import annotations

from oauth2_provider.oauth2_validators import OAuth2Validator


class ClaimsValidator(OAuth2Validator):
    """The claims a real provider gives: the address, whether it verified it (a user whose
    last name is "unverified" has an address it did not), and a preferred username."""

    def get_additional_claims(self, request):
        user = request.user
        return {
            "email": user.email,
            "email_verified": user.last_name != "unverified",
            "preferred_username": user.username,
            "name": user.get_full_name() or user.username,
        }
