"""Shards: frames written as extxyz shards with their manifest, by the `convert` commands."""
