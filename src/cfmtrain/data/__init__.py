"""Data sets: the embedded `mini` generator, the registry of real sets, downloads, converters."""
