import os
import sys

# Tests import small helpers (toy environments) from this folder.
sys.path.insert(0, os.path.dirname(__file__))

import gc

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops JAX's compiled executables and traces after each test module.

    The whole suite runs in one process and compiles hundreds of programs (MJX scenes, Llama, every
    algorithm); keeping all of them resident grew the process until XLA crashed while compiling a later
    test (a segfault inside ``backend_compile_and_load`` near the end of a full run). Tests never rely on
    a program compiled by another module, so each module starts with empty caches.
    """
    yield
    jax.clear_caches()
    gc.collect()


# The slow tier (``make test-slow``; ``make test`` runs the rest). Listed here, in one place, by
# ``file::test`` (every parametrisation) or ``file::test[id]`` (one), with the reason; timings are the
# whole-suite run on a 2-core CPU. Run the slow tier before changing what these tests cover.
SLOW = {
    # Long fast-tier tests whose behaviour a shorter fast test also checks (timings: clean clone, quiet).
    "test_cli.py::test_interrupted_train_resumes_to_the_uninterrupted_result": "CLI resume, 32 s; test_resume.py checks resumed == uninterrupted in the fast tier",
    "test_libero_mjx.py::test_mjx_step_freezes_done_rows": "MJX compile, 30 s",
    "test_algos_clevr.py::test_discrete_algorithm_learns_clevr_train_level[bcq]": "learning run, 22 s",
    "test_clevr_env.py::test_single_env_views_match_batched": "19 s; the batched kernel is checked against MuJoCo C in test_clevr_physics.py",
    "test_algos_learn.py::test_td3bc_vmapped_seeds_equal_sequential_runs": "16 s; vmapped == sequential stays in the fast tier for the engine, COMBO, BCQ and CQL",
    "test_algos_equivalence.py::test_prdc_with_the_row_itself_as_neighbour_is_td3bc_bit_for_bit[False]": "11 s; the [True] case stays",
    "test_clevr_expert.py::test_collected_dataset_is_consistent[hard]": "10 s; the other levels stay",
    "test_cheetah_expert.py::test_training_chunk_fills_the_buffer_with_env_transitions": "10 s; the expert's trainer, not the shipped expert",
    "test_sweep_sharding.py::test_sharded_runs_match_unsharded": "8 host devices in a subprocess, 34 s; the multi-process tests (slow) shard the same sweeps",
    "test_metaworld_expert.py::test_expert_collection_gives_successful_trajectories": "11 s; the expert's success is measured in the slow tier anyway",
    "test_llama_smollm2.py::test_weights_match_transformers": "19 s; greedy generation's parity with transformers stays in the fast tier",
    "test_imaginer_precision.py::test_bfloat16_logits_of_smollm2_are_close_to_float32": "SmolLM2 load and two compilations, 30 s; the tiny model's bfloat16 parity stays in the fast tier",
    "test_llama_smollm2.py::test_logits_match_transformers": "20 s; greedy generation's parity with transformers stays in the fast tier, and test_llama.py's logit parity on a random Llama",
    "test_cli.py::test_results_in_memory_equal_the_results_read_back": "a second bench training, 22 s; test_fit.py checks in-memory == read back in the fast tier",
    "test_algos_clevr.py::test_discrete_algorithm_learns_clevr_train_level[bc]": "learning run, 32 s with its data; every algorithm's learning run is in the slow tier",
    "test_cheetah_expert.py::test_packaged_expert_succeeds_on_every_task": "expert success, 10 s",
    "test_cheetah_expert.py::test_checkpoint_round_trip_and_policy_in_collect": "9 s; the expert's trainer, not the shipped expert",
    "test_gym_adapter.py::test_check_env_passes[text-libero]": "robot arm adapter, 8 s",
    "test_gym_adapter.py::test_check_env_passes[text-metaworld]": "robot arm adapter, 9 s",
    "test_shipped_imaginer.py::test_study_scores_the_shipped_imaginer": "13 s; the shipped imaginer's generation and scoring stay in the fast tier",
    "test_imaginer_validation.py::test_rows_of_real_validations_and_a_resumed_run_equal_an_uninterrupted_one": "generation compiles, 74 s; rows, rotation, the best checkpoint and resume stay in the fast tier with scripted scores",
    # Parity of MJX against MuJoCo C on every contact kind and every reset (3-5 min each).
    "test_metaworld_mjx.py::test_mjx_steps_agree_with_mujoco_c_on_every_contact_kind": "MJX parity",
    "test_metaworld_mjx.py::test_mjx_reset_agrees_with_mujoco_c_and_steps_agree_from_it": "MJX parity",
    "test_metaworld_mjx.py::test_reset_writes_of_every_task_agree_with_mujoco_c": "MJX parity",
    "test_metaworld_mjx.py::test_mjx_env_freezes_done_rows_and_marks_rows_of_other_tasks": "MJX parity",
    "test_libero_mjx.py::test_mjx_reset_is_legal_and_equals_the_host_reset": "MJX parity",
    "test_libero_mjx.py::test_mjx_agrees_with_mujoco_c_over_the_experts_grasp": "MJX parity",
    # Expert success measured over many episodes.
    "test_clevr_expert.py::test_default_expert_on_every_hard_goal": "expert success",
    "test_clevr_expert.py::test_expert_hard_report": "expert success",
    "test_libero_expert.py::test_expert_success_at_least_85_percent": "expert success",
    "test_libero_expert.py::test_expert_actions_are_bounded_and_task_specific": "expert rollouts",
    "test_metaworld_expert.py::test_expert_success_at_least_90_percent": "expert success",
    # Learning runs (hundreds to thousands of updates, then evaluation).
    "test_algos_clevr.py::test_discrete_algorithm_learns_clevr_train_level[cql]": "learning run",
    "test_algos_clevr.py::test_discrete_algorithm_learns_clevr_train_level[combo]": "learning run",
    "test_algos_clevr.py::test_discrete_algorithm_learns_clevr_train_level[prdc]": "learning run",
    "test_algos_clevr.py::test_discrete_algorithm_learns_clevr_train_level[td3bc]": "learning run",
    "test_algos_learn.py::test_td3bc_learns_continuous_reach": "learning run",
    "test_algos_learn.py::test_discrete_td3bc_learns_beyond_imitation": "learning run",
    "test_algos_learn.py::test_bcq_learns_beyond_imitation": "learning run",
    "test_bcq_continuous.py::test_learns_continuous_reach_through_the_engine": "learning run",
    "test_cql_continuous.py::test_learns_reach_with_three_alphas_in_one_call": "learning run",
    "test_combo.py::test_continuous_combo_learns_reach": "learning run",
    "test_combo.py::test_discrete_combo_learns_beyond_imitation_three_betas_in_one_call": "learning run",
    "test_combo.py::test_dynamics_learn_a_noisy_linear_system": "learning run",
    "test_prdc.py::test_discrete_prdc_three_alphas_with_a_wrong_majority": "learning run",
    "test_prdc.py::test_prdc_three_alphas_on_continuous_reach": "learning run",
    "test_kalm_finetune.py::test_tiny_preset_overfits_all_four_tasks": "imaginer fine-tuning run",
    "test_kalm_finetune.py::test_overfit_model_regenerates_its_trajectories": "imaginer fine-tuning run",
    "test_kalm_finetune.py::test_run_directory_loads_back": "imaginer fine-tuning run",
    # The robot arms through the adapters and the imaginer (the CLEVR/BabyAI/cheetah cases stay fast).
    "test_gym_adapter.py::test_adapter_replays_the_jax_environment[libero]": "robot arm adapter",
    "test_gym_adapter.py::test_adapter_replays_the_jax_environment[metaworld]": "robot arm adapter",
    "test_gym_adapter.py::test_check_env_passes[id-libero]": "robot arm adapter",
    "test_gym_adapter.py::test_check_env_passes[id-metaworld]": "robot arm adapter",
    "test_imagine_envs.py::test_libero_expert_trajectories_score_as_the_env_saw_them_and_hand_edited_states": "robot arm imagination",
    "test_imagine_envs.py::test_libero_generation_stops_on_the_task_predicate": "robot arm imagination",
    "test_imagine_envs.py::test_metaworld_generation_stops_on_the_task_predicate": "robot arm imagination",
    "test_imagine_envs.py::test_metaworld_expert_trajectories_and_hand_edited_states": "robot arm imagination",
    "test_libero_env.py::test_grasped_object_lifts_with_the_gripper_and_falls_when_released": "long physics rollout",
    "test_libero_env.py::test_controller_tracking_error_is_bounded": "long physics rollout",
    "test_frames.py::test_metaworld_and_libero_scenes_render_their_reset_states": "builds every Meta-World scene and renders in a fresh interpreter (40 s)",
    # The notebooks in a fresh venv, their install cell included (pip install from this checkout).
    "test_accelerator.py::test_dry_run_of_every_stage": "every stage of the accelerator run at tiny sizes: compiles dozens of programs and a bench",
    "test_notebooks.py::test_quickstart": "notebook in a fresh venv",
    "test_notebooks.py::test_imaginer": "notebook in a fresh venv",
    "test_notebooks.py::test_sweeps": "notebook in a fresh venv",
    # Several processes on 127.0.0.1, each compiling the sweep (1.5-5 min each on a busy 2-core machine).
    "test_distributed.py::test_two_processes_train_the_toy_sweep_bitwise_like_one": "multi-process sweep (90 s)",
    "test_distributed.py::test_clevr_sweeps_across_processes_equal_one_process": "multi-process CLEVR sweeps",
    "test_distributed.py::test_a_killed_process_stops_the_others_and_a_restart_resumes_to_the_same_result":
        "multi-process kill and restart",
    # End-to-end commands.
    "test_packaging.py::test_the_wheel_builds_without_warnings_and_holds_the_assets":
        "pip builds the wheel in an isolated environment (fetches setuptools from the index; 4-16 s)",
    "test_imagine.py::test_study_cli_runs_on_babyai": "end-to-end study",
    "test_readme.py::test_the_readme_chain_runs_verbatim": "the README's commands and blocks at their own sizes (minutes)",
    "test_llama_smollm2.py::test_tokenizer_matches_transformers": "whole-vocabulary tokenizer parity",
    # PPO through gymnax on CLEVR: until it beats the random policy (60 updates of 4096 steps, 6 min).
    "test_gymnax_env.py::test_ppo_learns_clevr_train_level_above_the_random_policy": "learning run",
    "test_gymnax_env.py::test_ppo_loop_through_gymnax_runs_and_updates[clevr]": "PPO compile; the learning run covers CLEVR",
    # Meta-World / LIBERO on MJX through brax's wrappers: MJX compiles these scenes for minutes (10 / 2 min).
    "test_brax_env.py::test_robot_arms_step_through_brax_wrap": "MJX robot arm",
}


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Marks the tests of :data:`SLOW` slow; a listed name that a collected file no longer has is an error
    (a renamed test must not silently move to the fast tier)."""
    seen, files = set(), set()
    for item in items:
        file = item.path.name
        files.add(file)
        for key in (f"{file}::{item.originalname}", f"{file}::{item.name}"):
            if key in SLOW:
                item.add_marker(pytest.mark.slow)
                seen.add(key)
    missing = sorted(k for k in SLOW if k.split("::")[0] in files and k not in seen)
    if missing and not any("::" in arg for arg in config.args):
        raise pytest.UsageError("tests/conftest.py SLOW lists tests that do not exist (renamed?): "
                                + ", ".join(missing))
