"""Shards: frames written as extxyz shards with their manifest, by `cfmtrain convert`."""
