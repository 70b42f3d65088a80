"""Frames: one structure with its labels: records, limits, label keys, the extxyz parser
and the neighbour search."""
