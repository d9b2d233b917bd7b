"""Writes for accounts: sign-up, profiles and the failed-login throttle."""

from __future__ import annotations

import functools
import hashlib
import secrets

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.shortcuts import get_object_or_404
from django.utils import timezone

from apps.accounts.models import ApiKey, Profile, StaffRead, Suspension, Tag, TagProposal, User
from core.redis_client import get_redis, keys


@transaction.atomic
def user_create(*, username: str, password: str, email: str = "", is_staff: bool = False) -> User:
    user = User(username=username, email=email, is_staff=is_staff, is_superuser=is_staff)
    user.set_password(password)
    user.save()
    Profile.objects.create(user=user, display_name=username)
    return user


def profile_get_or_create(*, user: User) -> Profile:
    profile, _ = Profile.objects.get_or_create(user=user, defaults={"display_name": user.username})
    return profile


@transaction.atomic
def profile_update(
    *,
    user: User,
    display_name: str,
    language: str,
    expertise: str,
    about: str,
    tags: list[Tag],
) -> Profile:
    profile = profile_get_or_create(user=user)
    profile.display_name = display_name
    profile.language = language
    profile.expertise = expertise
    profile.about = about
    profile.save()
    profile.tags.set([tag for tag in tags if tag.is_active])
    return profile


@transaction.atomic
def tag_proposal_decide(*, user: User, proposal_id: int, accept: bool) -> TagProposal:
    """The user's yes or no to a proposed tag; only a yes puts the tag on the profile.
    Http404 for a proposal that is not theirs or was decided already."""
    proposal = get_object_or_404(
        TagProposal.objects.select_for_update(),
        id=proposal_id,
        user=user,
        status=TagProposal.Status.PROPOSED,
    )
    proposal.status = TagProposal.Status.ACCEPTED if accept else TagProposal.Status.REJECTED
    proposal.decided = timezone.now()
    proposal.save(update_fields=["status", "decided"])
    if accept and proposal.tag.is_active:
        profile = profile_get_or_create(user=user)
        profile.tags.add(proposal.tag)
        profile.save(update_fields=["updated"])  # the profile changed: its caches follow
    return proposal


def _throttle_key(*, username: str, client_ip: str) -> str:
    # Hashed so that arbitrary usernames make safe, bounded keys.
    digest = hashlib.sha256(f"{username.lower()}|{client_ip}".encode()).hexdigest()[:32]
    return keys().login_failures(digest)


def login_throttle_seconds_left(*, username: str, client_ip: str) -> int:
    """Seconds until this account + address may try again; 0 when not throttled."""
    throttle_key = _throttle_key(username=username, client_ip=client_ip)
    failures, ttl = get_redis().pipeline().get(throttle_key).ttl(throttle_key).execute()
    if int(failures or 0) < settings.LOGIN_THROTTLE_ATTEMPTS:
        return 0
    return max(1, ttl)


def login_failure_record(*, username: str, client_ip: str) -> None:
    throttle_key = _throttle_key(username=username, client_ip=client_ip)
    # The window starts at the first failure: SET NX creates the key with its expiry once,
    # and INCR keeps that expiry (Redis 6.2 has no EXPIRE NX).
    window = settings.LOGIN_THROTTLE_WINDOW_SECONDS
    get_redis().pipeline().set(throttle_key, 0, ex=window, nx=True).incr(throttle_key).execute()


def login_failures_clear(*, username: str, client_ip: str) -> None:
    get_redis().delete(_throttle_key(username=username, client_ip=client_ip))


API_KEY_PREFIX = "sk-sluice-"


def api_key_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def api_key_create(*, user: User, name: str) -> tuple[ApiKey, str]:
    """Returns the stored key and the raw key, which is never stored and shown only now."""
    raw = API_KEY_PREFIX + secrets.token_urlsafe(32)
    name = (name or "").strip()[:80] or "API key"
    key = ApiKey.objects.create(user=user, name=name, prefix=raw[:14], key_hash=api_key_hash(raw))
    return key, raw


def api_key_revoke(*, user: User, key_id: int) -> None:
    key = get_object_or_404(ApiKey, user=user, id=key_id)
    key.revoked = True
    key.save(update_fields=["revoked"])


# A key's "last used" is written at most this often: a client sending many requests a second
# would otherwise make every one of them a write.
LAST_USED_RESOLUTION_SECONDS = 60


@functools.cache
def _api_key_sql(also: str = "") -> str:
    api_keys, users = ApiKey._meta.db_table, User._meta.db_table
    columns = ", ".join(f'u."{f.column}"' for f in User._meta.concrete_fields)
    also = f", {also}" if also else ""
    # The lookup and the (rare) `last_used` write in one statement: every API request passes
    # here, and building the ORM's queries cost more than running them.
    return f"""
        WITH found AS (
            SELECT k.id, k.user_id FROM {api_keys} k JOIN {users} u ON u.id = k.user_id
            WHERE k.key_hash = %s AND NOT k.revoked AND u.is_active
        ), touched AS (
            UPDATE {api_keys} SET last_used = now()
            WHERE id IN (SELECT id FROM found) AND (last_used IS NULL
                OR last_used < now() - interval '{LAST_USED_RESOLUTION_SECONDS} seconds')
        )
        SELECT {columns}{also} FROM {users} u WHERE u.id IN (SELECT user_id FROM found)
    """


def api_key_authenticate(*, raw: str, also: str = "") -> User | None:
    """The active user whose unrevoked key this is, else None. `also`: more columns for the
    same statement, SQL expressions over the user's row `u` (`expression AS name`), each set
    on the user as an attribute of its name: what a caller needs with every request (its
    plan, admission.selectors.api_key_caller) costs no round trip of its own. A plain cursor:
    a raw queryset's column mapping cost more than the query."""
    if not raw.startswith(API_KEY_PREFIX):
        return None
    with connection.cursor() as cursor:
        cursor.execute(_api_key_sql(also), [api_key_hash(raw)])
        row = cursor.fetchone()
        names = [column.name for column in cursor.description or ()]
    if row is None:
        return None
    fields = User._meta.concrete_fields
    values = []
    for field, value in zip(fields, row, strict=False):
        for convert in field.get_db_converters(connection):
            value = convert(value, field, connection)
        values.append(value)
    user = User.from_db(connection.alias, [f.attname for f in fields], values)
    for name, value in zip(names[len(fields) :], row[len(fields) :], strict=True):
        setattr(user, name, value)
    return user


def staff_read_record(
    *, reader: User, owners: list[tuple[User, str]], subject: str, reason: str, address: str
) -> list[StaffRead]:
    """Records that `reader` read, for `reason`, the `subject` (one id per owner) of each
    owner: one row each, in one statement."""
    rows = [
        StaffRead(
            reader=reader,
            reader_name=reader.get_username(),
            owner=owner,
            owner_name=owner.get_username(),
            subject=subject,
            subject_id=str(subject_id)[:64],
            reason=reason,
            address=address or None,
        )
        for owner, subject_id in owners
    ]
    return StaffRead.objects.bulk_create(rows)


@transaction.atomic
def user_suspend(*, user: User, reason: str, until, by: User | None) -> Suspension:
    """Suspends `user` (replacing any suspension that stands): the account goes inactive, which
    ends their sessions, sockets, event streams and API keys at once (apps/accounts/signals.py
    publishes the change after the commit)."""
    now = timezone.now()
    Suspension.objects.filter(user=user, lifted__isnull=True).update(lifted=now)
    suspension = Suspension.objects.create(user=user, reason=reason, until=until, by=by)
    if user.is_active:
        user.is_active = False
        user.save(update_fields=["is_active"])
    return suspension


@transaction.atomic
def user_suspension_lift(*, suspension: Suspension) -> None:
    """Ends a suspension (lifted by staff, or its time is up): the account is active again."""
    if suspension.lifted is None:
        suspension.lifted = timezone.now()
        suspension.save(update_fields=["lifted"])
    user = User.objects.get(pk=suspension.user_id)
    if not user.is_active:
        user.is_active = True
        user.save(update_fields=["is_active"])


def suspension_standing_for_login(*, username: str) -> Suspension | None:
    """The suspension that stands for the account signing in as `username` (or with that email
    address), if any; one whose time is up is lifted here, so the sign-in goes on as usual."""
    named = Q(user__username=username)
    if "@" in username:
        named |= Q(user__email__iexact=username)
    suspension = (
        Suspension.objects.select_related("user")
        .filter(named, lifted__isnull=True)
        .order_by("-created")
        .first()
    )
    if suspension is not None and suspension.until and suspension.until <= timezone.now():
        user_suspension_lift(suspension=suspension)
        return None
    return suspension


def suspensions_lift_expired() -> int:
    """Lifts every suspension whose time is up (`manage.py lift_suspensions`, from cron: an
    API key of a person whose suspension ended works again without them signing in)."""
    expired = Suspension.objects.filter(lifted__isnull=True, until__lte=timezone.now())
    count = 0
    for suspension in expired:
        user_suspension_lift(suspension=suspension)
        count += 1
    return count
