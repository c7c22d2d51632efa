"""scene3d docs: the JSDoc parser on small real snippets, the index over the vendored three package
and the ECS schemas, and the answers `search` gives the agent."""

from __future__ import annotations

import pytest

from longhaul.envs.scene3d import docs
from longhaul.envs.scene3d.export import three_build_dir
from longhaul.envs.scene3d.world import SCHEMAS
from longhaul.errors import LonghaulError


def _needs_three():
    try:
        three_build_dir()
    except LonghaulError as e:
        pytest.skip(f"three.js is not installed, so its API docs cannot be indexed: {e}")
    if docs.three_root() is None:
        pytest.skip("the three package has no src/ folder to read JSDoc from; reinstall it with `make scene3d`")


def _entries(out: str) -> list[str]:
    """The entry blocks of an answer, without the note about three missing."""
    return [b for b in out.split("\n\n") if b and not b.startswith("(three.js API docs")]


JS = '''
/**
 * A lamp on a pole.
 *
 * ```js
 * const lamp = new Lamp( 2 );
 * ```
 *
 * @augments Light
 */
class Lamp extends Light {

	/**
	 * Constructs a lamp.
	 *
	 * @param {number} [height=2] - The pole's height.
	 * @param {{a: number}} options - Extra settings.
	 */
	constructor( height, options ) {

		/**
		 * Whether the lamp throws shadows, see {@link Object3D#castShadow}.
		 *
		 * @type {boolean}
		 * @default true
		 */
		this.castShadow = true;

		/**
		 * @type {boolean}
		 * @readonly
		 */
		this.isLamp = true;

		/**
		 * Internal state.
		 *
		 * @private
		 */
		this._state = null;

	}

	/**
	 * Dims the lamp.
	 *
	 * @param {number} amount - How much.
	 * @return {Lamp} A reference to this lamp.
	 */
	dim( amount ) {}

	/**
	 * The light's brightness.
	 *
	 * @type {number}
	 */
	get brightness() {}

}

/**
 * @typedef {Object} Lamp~Options
 * @property {number} [glow=1] - How much it glows.
 **/

/**
 * @typedef
 */

/**
 * A top-level constant.
 *
 * @type {number}
 * @constant
 */
export const LampCount = 3;

/** an unterminated block at the end of a file
'''


def test_parse_file_reads_classes_members_and_typedefs():
    by_name = {e.name: e for e in docs.parse_file(JS, "three src/Lamp.js", top_level=True)}
    assert set(by_name) == {"Lamp", "Lamp.castShadow", "Lamp.dim", "Lamp.brightness", "Lamp~Options", "LampCount"}
    lamp = by_name["Lamp"]
    assert (lamp.kind, lamp.parent, lamp.text) == ("class", "Light", "A lamp on a pole.")
    assert lamp.signature == "new Lamp(height: number = 2, options: {a: number})"
    assert lamp.details == ("height: The pole's height.", "options: Extra settings.")
    assert by_name["Lamp.castShadow"].signature == "Lamp.castShadow: boolean = true"
    assert by_name["Lamp.castShadow"].text == "Whether the lamp throws shadows, see Object3D.castShadow."
    assert by_name["Lamp.dim"].signature == "Lamp.dim(amount: number) -> Lamp"
    assert by_name["Lamp.dim"].kind == "method" and by_name["Lamp.brightness"].kind == "property"
    assert by_name["Lamp~Options"].details == ("glow: number = 1 - How much it glows.",)
    assert docs.parse_file(JS, "three src/nodes/Lamp.js", top_level=False)[-1].name != "LampCount"


def test_parse_file_survives_odd_input():
    for text in ("", "/**/", "/** */", "/** @param */\nfoo(", "/** @type {Array<{a:{b:1}}} */\nthis.x = 1;",
                 "class A {\n/** @param {number */\nconstructor() {}\n", "/** @name A# */\nObject.defineProperty"):
        docs.parse_file(text, "three src/odd.js", top_level=True)


def test_tokens_split_camel_and_snake_case():
    assert docs.tokens("castShadow") == ["castshadow", "cast", "shadow"]
    assert docs.tokens("cast_shadows of the WebGLRenderer") == ["cast", "shadow", "webglrenderer", "web", "gl", "renderer"]


def test_components_come_from_schemas():
    entries = docs.component_entries()
    assert [e.name for e in entries] == list(SCHEMAS)
    for e in entries:
        text = "\n".join(e.details)
        assert all(f"{field}:" in text for field in SCHEMAS[e.name]), e.render()


def test_index_holds_three_and_every_component():
    _needs_three()
    entries = docs.index()
    three = [e for e in entries if e.source.startswith("three ")]
    assert len(three) > 300
    assert sorted(e.name for e in entries if e.kind == "component") == sorted(SCHEMAS)
    names = {e.name for e in three}
    assert {"DirectionalLight", "Object3D.castShadow", "MeshStandardMaterial.roughness", "PerspectiveCamera.fov"} <= names
    assert not [n for n in names if n.rpartition(".")[2].startswith(("_", "#"))]


def test_search_finds_three_api():
    _needs_three()
    out = docs.search("cast shadow directional light")
    assert "class DirectionalLight extends Light" in out and "Object3D.castShadow" in out, out
    assert "MeshStandardMaterial" in docs.search("roughness")


def test_search_finds_our_components():
    out = docs.search("behaviour spin rate")
    assert _entries(out)[0].startswith("component behaviour: set_component(entity, \"behaviour\""), out


def test_search_answers_help_and_no_match_in_one_line():
    assert docs.search("") == docs.search("  ?? !") == docs.search("the of") == docs.HELP
    assert "\n" not in docs.HELP
    out = docs.search("qqzxv")
    assert "no entries match 'qqzxv'" in out.splitlines()[-1]


@pytest.mark.parametrize("query", ["light", "material color texture map", "set position rotation scale", "x"])
def test_search_output_is_capped(query):
    out = docs.search(query, k=50)
    assert len(out) <= docs.MAX_CHARS
    for block in _entries(out):  # a component's entry also has its description's lines
        assert len(block.splitlines()) <= 1 + docs.BODY_LINES + 4 * block.startswith("component "), block


def test_search_without_three_answers_from_components(monkeypatch, tmp_path):
    monkeypatch.setenv("LONGHAUL_THREE_DIR", str(tmp_path))  # no three.module.js there
    assert docs.three_root() is None
    assert [e.kind for e in docs.index()] == ["component"] * len(SCHEMAS)
    out = docs.search("light intensity")
    assert out.splitlines()[0] == docs.NO_THREE and "make scene3d" in docs.NO_THREE
    assert _entries(out)[0].startswith("component light:"), out
