from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.db.models import Count, Q

from apps.accounts.forms import ThrottledAdminAuthenticationForm
from apps.accounts.models import ApiKey, Profile, Tag, TagProposal, User

# The admin's login counts failures with the site login's throttle (same helpers, same limits).
admin.site.login_form = ThrottledAdminAuthenticationForm


class ProfileInline(admin.StackedInline):
    model = Profile
    can_delete = False
    filter_horizontal = ("tags",)


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    inlines = [ProfileInline]
    list_display = ("username", "email", "is_staff", "is_active", "date_joined", "last_login")
    list_filter = ("is_staff", "is_superuser", "is_active", "profile__tags")


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
