"""Upstream's module name for profiles (`from sandlock._profile import ...`)."""

from .profiles import (list_profiles, load_profile, load_profile_path,  # noqa: F401
                       merge_cli_overrides, policy_from_toml, profiles_dir)

__all__ = ["list_profiles", "load_profile", "load_profile_path", "merge_cli_overrides", "policy_from_toml", "profiles_dir"]
