from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from .forms import ThrottledAdminAuthenticationForm
from .models import ApiKey, Profile, Tag, User

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
    list_display = ("name", "slug", "prompt_hint", "is_active", "user_count")
    list_filter = ("is_active",)
    search_fields = ("name", "slug", "prompt_hint")
    prepopulated_fields = {"slug": ("name",)}

    @admin.display(description="users")
    def user_count(self, tag: Tag) -> int:
        return tag.profiles.count()


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
