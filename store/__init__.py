"""Object stores (file://, s3://) and the checkpoint layout shared by the pool and the CLI."""

from store.objects import ObjectInfo, ObjectStore, StoreConfig, StoreCounters, coalesce_ranges, open_store, validate_key

__all__ = ["ObjectInfo", "ObjectStore", "StoreConfig", "StoreCounters", "coalesce_ranges", "open_store", "validate_key"]
