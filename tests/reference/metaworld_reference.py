"""Runs the metaworld package's own environments in the Meta-World reference interpreter.

It holds no tests: tests/test_metaworld_parity.py executes this file as a script with that interpreter
(metaworld 3.1.1 needs mujoco 3.3, which the project's virtualenv does not have). It is named test_* only
to sit with the Meta-World tests; pytest collects nothing from it.

Input (JSON on stdin): {"cases": [{"env": "reach-v3", "rand": [...], "steps": T, "actions": [[...]] | null,
"zero_warmstart": bool}]}. ``zero_warmstart`` zeroes MuJoCo's solver warm start before every environment
step (not during the reset), as the port's batched stepper does.
With ``actions`` null the case runs metaworld's scripted policy for the task and records its actions.
Output (JSON on stdout): per case the initial observation, and per step the action, observation,
tcp centre, reward and success flag.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np


def policy_for(env_name: str):
    import metaworld.policies as policies

    camel = "".join(part.capitalize() for part in re.split(r"[-]", env_name.removesuffix("-v3")))
    return getattr(policies, f"Sawyer{camel}V3Policy")()


def patch_mocap_welds() -> None:
    """metaworld 3.1.1 writes 11 weld parameters into ``eq_data``, which has 12 columns from MuJoCo 3.4 on
    and makes its reset fail; write the same 11 values into the first 11 columns instead (the only change)."""
    import mujoco
    import metaworld.sawyer_xyz_env as sawyer_xyz_env

    def reset_mocap_welds(self) -> None:
        if self.model.nmocap > 0 and self.model.eq_data is not None:
            for i in range(self.model.eq_data.shape[0]):
                if self.model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                    self.model.eq_data[i, :11] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 5.0]

    sawyer_xyz_env.SawyerMocapBase.reset_mocap_welds = reset_mocap_welds


def run_case(case: dict) -> dict:
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE

    env = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[f"{case['env']}-goal-observable"](seed=0)
    env._freeze_rand_vec = True
    env._last_rand_vec = np.asarray(case["rand"], np.float64)
    env.max_path_length = 10_000
    obs, _ = env.reset()
    if case.get("zero_warmstart"):  # start every environment step's solver from zero, like the port
        simulate = env.do_simulation

        def do_simulation(ctrl, n_frames):
            env.data.qacc_warmstart[:] = 0.0
            return simulate(ctrl, n_frames)

        env.do_simulation = do_simulation
    policy = policy_for(case["env"]) if case.get("actions") is None else None
    out = {"obs0": obs.tolist(), "tcp0": env.tcp_center.tolist(), "actions": [], "obs": [], "tcp": [],
           "reward": [], "success": []}
    for t in range(case["steps"]):
        if policy is not None:
            action = np.clip(policy.get_action(obs), -1.0, 1.0).astype(np.float32)
        else:
            action = np.asarray(case["actions"][t], np.float32)
        obs, reward, _, _, info = env.step(action)
        out["actions"].append(action.tolist())
        out["obs"].append(obs.tolist())
        out["tcp"].append(env.tcp_center.tolist())
        out["reward"].append(float(reward))
        out["success"].append(bool(info["success"]))
    return out


def main() -> None:
    import mujoco

    if mujoco.mjNEQDATA != 11:
        patch_mocap_welds()
    request = json.load(sys.stdin)
    json.dump({"cases": [run_case(c) for c in request["cases"]]}, sys.stdout)


if __name__ == "__main__":
    main()
