"""The checkpoint folder's layout (``pettingllms_verl/checkpoints.py``): step folders found and named one way."""

from pettingllms_verl.checkpoints import PARTIAL_SUFFIX, step_folder, step_of, steps_in


def test_only_whole_step_folders_count_in_order_of_their_step(tmp_path):
    for name in ("global_step_10", "global_step_9", f"global_step_11{PARTIAL_SUFFIX}", "global_step_x", "old_global_step_12", "notes"):
        (tmp_path / name).mkdir()
    assert steps_in(tmp_path) == [9, 10] and steps_in(tmp_path / "missing") == []
    assert step_of(step_folder(tmp_path, 7)) == 7 and step_of(f"{tmp_path}/global_step_7/") == 7
    assert step_of(f"{tmp_path}/global_step_7{PARTIAL_SUFFIX}") is None and step_of("run/global_step_") is None
    assert step_of("run/old_global_step_7") is None and step_of("run/global_step_7/policies") is None and step_of("global_step_7\n") is None
