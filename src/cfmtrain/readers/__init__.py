"""Readers: one module per input format (the table: cfmtrain.frames.formats), frames out, and
how a registered or an own data set labels them."""
