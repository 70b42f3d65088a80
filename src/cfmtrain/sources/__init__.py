"""Sources: where frames come from: the embedded `mini` generator, the registry of real
sets, downloads."""
