from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.db.models import Count, Q

from apps.accounts import read_gate, services
from apps.accounts.models import ApiKey, Profile, StaffRead, Suspension, Tag, TagProposal, User


class ProfileInline(admin.StackedInline):
    model = Profile
    can_delete = False
    filter_horizontal = ("tags",)


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    inlines = [ProfileInline]
    list_display = ("username", "email", "is_staff", "is_active", "date_joined", "last_login")
    list_filter = ("is_staff", "is_superuser", "is_active", "profile__tags")

    def get_deleted_objects(self, objs, request):
        """Deleting a person lists what goes with them by kind and count only: the list of
        each object by name would show their files' names and what they wrote."""
        _listed, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)
        return [str(obj) for obj in objs], model_count, perms_needed, protected


@admin.register(Tag)
class TagAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "slug",
        "prompt_hint",
        "is_active",
        "user_count",
        "proposed",
        "accepted",
        "rejected",
    )
    list_filter = ("is_active",)
    search_fields = ("name", "slug", "prompt_hint")
    prepopulated_fields = {"slug": ("name",)}

    @admin.display(description="users")
    def user_count(self, tag: Tag) -> int:
        return tag.profiles.count()

    # Adoption of the tags Sluice proposes from users' questions (counted in one query).
    def get_queryset(self, request):
        decided = TagProposal.Status
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_proposed=Count("proposals", distinct=True),
                n_accepted=Count(
                    "proposals", filter=Q(proposals__status=decided.ACCEPTED), distinct=True
                ),
                n_rejected=Count(
                    "proposals", filter=Q(proposals__status=decided.REJECTED), distinct=True
                ),
            )
        )

    @admin.display(description="proposed", ordering="n_proposed")
    def proposed(self, tag: Tag) -> int:
        return tag.n_proposed

    @admin.display(description="accepted", ordering="n_accepted")
    def accepted(self, tag: Tag) -> int:
        return tag.n_accepted

    @admin.display(description="rejected", ordering="n_rejected")
    def rejected(self, tag: Tag) -> int:
        return tag.n_rejected


@admin.register(TagProposal)
class TagProposalAdmin(admin.ModelAdmin):
    list_display = ("tag", "user", "status", "created", "decided")
    list_filter = ("status", "tag")
    search_fields = ("user__username", "tag__name")
    list_select_related = ("tag", "user")


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ("user", "display_name", "language", "expertise", "updated")
    list_filter = ("expertise", "language", "tags")
    search_fields = ("user__username", "display_name", "about")
    filter_horizontal = ("tags",)
    list_select_related = ("user",)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created", "last_used", "revoked")
    list_filter = ("revoked", "created")
    search_fields = ("name", "prefix", "user__username")
    readonly_fields = ("prefix", "key_hash", "created", "last_used")
    list_select_related = ("user",)


@admin.register(StaffRead)
class StaffReadAdmin(admin.ModelAdmin):
    """The staff read log, to read only: nothing here adds, changes or deletes a row (the
    model and a database trigger refuse it as well). Open to staff who may read other people's
    conversations (each sees the others' reads) and to those given the log's view permission."""

    list_display = ("at", "reader_name", "owner_name", "subject", "subject_id", "reason", "address")
    list_filter = ("subject", "at")
    search_fields = ("reader_name", "owner_name", "subject_id")
    date_hierarchy = "at"
    fields = list_display
    readonly_fields = list_display
    actions = None

    def _may_view(self, request) -> bool:
        user = request.user
        return read_gate.may_read_others(user) or (
            user.is_active and user.is_staff and user.has_perm("accounts.view_staffread")
        )

    def has_module_permission(self, request) -> bool:
        return self._may_view(request)

    def has_view_permission(self, request, obj=None) -> bool:
        return self._may_view(request)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Suspension)
class SuspensionAdmin(admin.ModelAdmin):
    """Suspending someone: pick them, say why and until when, save. Their open pages and
    streams end at once, their API keys stop, and sign-in tells them the reason. A saved
    suspension is not edited: lift it (the action) and suspend again."""

    list_display = ("user", "reason", "until", "by", "created", "lifted")
    list_filter = ("lifted", "created")
    search_fields = ("user__username", "reason")
    list_select_related = ("user", "by")
    raw_id_fields = ("user",)
    fields = ("user", "reason", "until")
    actions = ["lift_selected"]

    def get_readonly_fields(self, request, obj=None):
        return ("user", "reason", "until", "by", "created", "lifted") if obj else ()

    def get_fields(self, request, obj=None):
        return ("user", "reason", "until", "by", "created", "lifted") if obj else self.fields

    def has_change_permission(self, request, obj=None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the history of suspensions stays; lifting ends one

    def save_model(self, request, obj, form, change) -> None:
        if change:
            return
        made = services.user_suspend(
            user=obj.user, reason=obj.reason, until=obj.until, by=request.user
        )
        obj.pk, obj.by, obj.created = made.pk, made.by, made.created

    @admin.action(description="Lift the selected suspensions", permissions=["add"])
    def lift_selected(self, request, queryset):
        lifted = 0
        for suspension in queryset.filter(lifted__isnull=True):
            services.user_suspension_lift(suspension=suspension)
            lifted += 1
        self.message_user(request, f"{lifted} suspension(s) lifted.")
