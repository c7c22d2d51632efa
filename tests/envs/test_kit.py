"""The procedural task kit (`longhaul.envs.kit`): the generated families make exactly the tasks they
made before they shared it (digests pinned from the tree before the kit), and the kit's draw,
splits and registry on their own."""

import random

import pytest

from longhaul.envs import echo, funcgen, kit, multistep, terminal
from split_digest import split_digest

# split_digest over the families as they were before they shared the kit; a change here means the
# generated tasks changed, which needs a new family VERSION, not a new pin.
PINNED = {"funcgen": "9dbd54fd3ddab99f", "terminal": "96b402169d899624", "multistep": "712c2ca0a9114f28",
          "echo": "6b770ae4852a0cf9"}


@pytest.mark.parametrize("name, mod", [("funcgen", funcgen), ("terminal", terminal), ("multistep", multistep)])
def test_generated_families_make_the_tasks_they_made_before(name, mod):
    assert split_digest(mod.make_split, mod.SUBFAMILIES) == PINNED[name]


def test_echo_makes_the_tasks_it_made_before():
    assert split_digest(lambda s, n, d, sub: echo.make_split(s, n, d), ()) == PINNED["echo"]


def test_the_families_share_one_registry_type_and_one_split():
    for mod in (funcgen, terminal, multistep):
        assert all(isinstance(s, kit.SubFamily) for s in mod.SUBFAMILIES.values())
        assert mod.DIFFICULTIES == kit.DIFFICULTIES and mod.SPLIT_SEED_BASE == kit.SPLIT_SEED_BASE
    assert all(s.names for s in funcgen.SUBFAMILIES.values())  # entry-point synonyms
    assert not any(s.names for s in terminal.SUBFAMILIES.values())


def _registry():
    reg, register = kit.make_registry()
    for name in ("c", "a", "b"):
        register(name, f"{name}_fn")(lambda rng, d, name=name: (name, d, rng.random()))
    return reg


def test_draw_is_seeded_and_forcing_keeps_the_rest_of_the_stream():
    reg = _registry()
    assert reg["a"] == kit.SubFamily("a", reg["a"].build, ("a_fn",))
    rng, sub = kit.draw(reg, 7)
    r2, sub2 = kit.draw(reg, 7)
    assert sub is sub2 and rng.random() == r2.random()
    ref = random.Random(7)
    assert sub.name == sorted(reg)[ref.randrange(3)]
    forced_rng, forced = kit.draw(reg, 7, "c")
    assert forced.name == "c" and forced_rng.random() == ref.random()
    with pytest.raises(ValueError, match="unknown sub-family 'z'; valid: a, b, c"):
        kit.draw(reg, 7, "z")


def test_split_tasks_seeds_restricts_and_validates():
    reg = _registry()
    seen = []

    def make(seed, d, sub):
        seen.append((seed, d, sub))
        return seed

    assert kit.split_tasks(make, reg, "heldout", 3, 2) == [1_000_000, 1_000_001, 1_000_002]
    assert seen == [(1_000_000, 2, None), (1_000_001, 2, None), (1_000_002, 2, None)]
    seen.clear()
    kit.split_tasks(make, reg, "train", 40, 1, ["a", "b"])
    assert {s for _, _, s in seen} == {"a", "b"}
    assert [s for _, _, s in seen] == [["a", "b"][random.Random(i).randrange(2)] for i in range(40)]
    for args, fragment in [(("test", 1), "valid splits: train, heldout"), (("train", 1, 4), r"\(1, 2, 3\)"),
                           (("train", -1), "non-negative"), (("train", 1.5), "non-negative"),
                           (("train", 1, 1, ["z"]), "valid: a, b, c"), (("train", 1, 1, []), "empty")]:
        with pytest.raises(ValueError, match=fragment):
            kit.split_tasks(make, reg, *args)


def test_pick_and_words():
    assert [kit.pick(d, "one", "two", "three") for d in kit.DIFFICULTIES] == ["one", "two", "three"]
    rng = random.Random(0)
    ws = kit.words(rng, 30, 1, 2, avoid=("ba",))
    assert len(set(ws)) == 30 and "ba" not in ws and all(w.isalpha() and w.islower() for w in ws)
    assert kit.lines(["a", 1]) == "a\n1\n" and kit.lines([]) == ""
