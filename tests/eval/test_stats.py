import math

from longhaul.eval.stats import mcnemar_exact, paired_bootstrap, wilson


def test_wilson_bounds_solve_the_score_equation():
    # Wilson bounds are the p0 where the score test is exactly at z: (phat - p0)^2 = z^2 p0 (1 - p0) / n
    z = 1.959964
    for k, n in [(22, 120), (37, 120), (3, 200), (150, 164)]:
        lo, hi = wilson(k, n)
        for p0 in (lo, hi):
            resid = (k / n - p0) ** 2 - z * z * p0 * (1 - p0) / n
            assert abs(resid) < 1e-12, (k, n, p0, resid)
        assert lo < k / n < hi
    assert wilson(0, 10)[0] == 0.0


def test_mcnemar_exact_known_p_values():
    before = [False] * 10 + [True] * 5
    after = [True] * 10 + [True] * 5
    r = mcnemar_exact(before, after)
    assert r["gained"] == 10 and r["lost"] == 0
    assert math.isclose(r["p_value"], 2 / 1024, rel_tol=1e-12)
    r = mcnemar_exact([True, False, True], [False, True, True])
    assert r["p_value"] == 1.0


def test_paired_bootstrap_contains_the_observed_difference():
    before = [i % 5 == 0 for i in range(100)]
    after = [i % 3 == 0 for i in range(100)]
    lo, hi = paired_bootstrap(before, after, iters=2000)
    diff = (sum(after) - sum(before)) / 100
    assert lo <= diff <= hi


def test_pass_at_k_matches_the_combinatorial_definition():
    from longhaul.eval.stats import pass_at_k

    for n, c, k in [(10, 3, 1), (10, 3, 5), (20, 0, 5), (20, 20, 5), (7, 2, 7), (5, 1, 2)]:
        want = 1.0 - math.comb(n - c, k) / math.comb(n, k)
        assert abs(pass_at_k(n, c, k) - want) < 1e-12, (n, c, k)
    assert abs(pass_at_k(10, 3, 1) - 0.3) < 1e-12


def test_compare_groups_by_sub_family():
    from longhaul.eval.passrate import EvalResult, compare

    ids = ["funcgen/v1/dicts.invert/d1/5", "funcgen/v1/dicts.invert/d1/6", "funcgen/v1/lists.scale/d1/7", "echo/v1/d1/0"]
    base = EvalResult("base", ids, [False, True, False, False], ["fail", "pass", "fail", "fail"])
    trained = EvalResult("trained", ids, [True, True, True, False], ["pass", "pass", "pass", "fail"])
    c = compare(base, trained)
    assert c["by_group"] == {"dicts.invert": {"n": 2, "base": 1, "trained": 2}, "lists.scale": {"n": 1, "base": 0, "trained": 1},
                             "echo": {"n": 1, "base": 0, "trained": 0}}
    assert c["mcnemar"]["gained"] == 2 and c["mcnemar"]["lost"] == 0


def test_partial_credit_is_summarised_kept_and_joined(tmp_path):
    from longhaul.eval.passrate import EvalResult

    a = EvalResult("sft", ["s/1", "s/2", "s/3"], [True, False, False], ["pass", "fail", "fail"], rewards=[1.0, 0.5, 0.25])
    s = a.summary(ks=(1,))
    assert abs(s["mean_reward"] - 1.75 / 3) < 1e-12 and s["mean_reward_ci95"][0] <= s["mean_reward"] <= s["mean_reward_ci95"][1]
    a.save(tmp_path / "a.json")
    assert EvalResult.load(tmp_path / "a.json").rewards == [1.0, 0.5, 0.25]
    b = EvalResult("sft", ["t/1"], [True], ["pass"], rewards=[1.0])
    assert EvalResult.concat([a, b]).rewards == [1.0, 0.5, 0.25, 1.0]
    assert EvalResult.concat([a, EvalResult("sft", ["t/2"], [False], ["fail"])]).rewards is None  # not every set gave it
    assert "mean_reward" not in EvalResult("x", ["t/2"], [False], ["fail"]).summary()
