"""Frames: one structure with its labels: records, limits, label keys, the input formats'
table, the extxyz parser and the neighbour search."""
