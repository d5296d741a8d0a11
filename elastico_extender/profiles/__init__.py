"""Profile storage: measured RST profiles kept in an embedded SQLite file."""

from elastico_extender.profiles.store import ProfileRecord, ProfileStore

__all__ = ["ProfileRecord", "ProfileStore"]
