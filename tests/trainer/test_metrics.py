"""The trainer's per-policy metrics (``trainer/metrics.py``), as pure functions over rows' tags."""

from pettingllms_verl.trainer.metrics import policy_metrics, staleness


def test_staleness_counts_pushes_behind_the_weights_a_step_trains_from_each_rows_oldest_reply():
    tags = [{"mas_weight_versions": [4]}, {"mas_weight_versions": [2, 4]}, {"mas_weight_versions": []}, {}]  # the last two: placeholders
    assert staleness(tags, global_steps=5) == {"off_policy/staleness_mean": 1.0, "off_policy/staleness_max": 2.0}
    assert staleness([{"mas_weight_versions": [4]}], global_steps=5) == {"off_policy/staleness_mean": 0.0, "off_policy/staleness_max": 0.0}
    assert staleness([{}], global_steps=5) == {}


def test_verls_plain_names_average_the_trainable_policies_and_every_policy_keeps_its_own():
    per_policy = {"a": {"rows": 4.0, "actor/grad_norm": 1.0, "off_policy/untrained_rows": 1.0}, "b": {"rows": 2.0, "actor/grad_norm": 3.0},
                  "frozen": {"rows": 6.0}}
    metrics = policy_metrics(per_policy, trainable={"a", "b"})
    assert metrics["actor/grad_norm"] == 2.0 and "rows" not in metrics  # rows are per policy only
    assert metrics["policy/a/off_policy/untrained_rows"] == 1.0 and "off_policy/untrained_rows" not in metrics  # so is what a bound left
    assert metrics["policy/a/rows"] == 4.0 and metrics["policy/frozen/rows"] == 6.0 and metrics["policy/b/actor/grad_norm"] == 3.0
    assert policy_metrics({"x": {"rows": 1.0, "k": 5.0}}, trainable=set())["k"] == 5.0  # every policy frozen: over all
