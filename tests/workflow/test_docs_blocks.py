"""The generated blocks of a page: each filled between its own markers, an empty one too, and
the model preset's table the preset's own values."""

from __future__ import annotations

from cfmtrain import docs
from cfmtrain.train import presets


def test_an_empty_block_before_another_is_filled_in_place():
    page = ("intro\n<!-- cfmtrain docs: a -->\n<!-- cfmtrain docs: end -->\nmiddle\n"
            "<!-- cfmtrain docs: b -->\nold b\n<!-- cfmtrain docs: end -->\nend\n")
    for name, body in (("a", "new a"), ("b", "new b")):
        page = docs._block(name).sub(lambda m, body=body: f"{m.group(1)}{body}\n{m.group(2)}",
                                     page)
    assert page == ("intro\n<!-- cfmtrain docs: a -->\nnew a\n<!-- cfmtrain docs: end -->\n"
                    "middle\n<!-- cfmtrain docs: b -->\nnew b\n<!-- cfmtrain docs: end -->\nend\n")


def test_preset_table_holds_every_key_of_both_presets():
    table = docs.preset_table()
    for key, value in presets.flat(presets.MODEL).items():
        assert f"| `{key}` | `{value}` |" in table, key
    for key, value in presets.flat(presets.FINE_TUNE).items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{key}` |"))
        assert row.endswith(f"| `{value}` |"), row
