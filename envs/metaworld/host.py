"""Host side of the Meta-World MuJoCo C backend: the compiled task models, the batched stepper and the
reset procedure, replicating Meta-World's step for step: ``mj_resetData``; the fixtures placed from the
random vector (as mocap bodies); ``_reset_hand`` (250 MuJoCo steps with the hand's mocap at ``hand_init``,
``init_tcp`` read one step stale); the task's qpos/qvel writes and constants. Deterministic given the
random vector, which the environment draws in JAX (docs/envs.md, "Meta-World").
"""

from __future__ import annotations

import threading
from typing import Final

import mujoco
import numpy as np

from imaginejax.envs.mujoco_host import FULLPHYSICS, HostStepper, pack64, state_layout, unpack64
from imaginejax.envs.metaworld import scenes
from imaginejax.envs.metaworld.tasks import CONST_DIM, RAND_DIM, TASKS, TaskSpec

__all__ = ["CONTROL_SPEC", "FRAME_SKIP", "MetaWorldHost", "RESET_STEPS", "get_host"]

FRAME_SKIP: Final[int] = 5
RESET_STEPS: Final[int] = 50 * FRAME_SKIP
HAND_QUAT: Final[np.ndarray] = np.array([1.0, 0.0, 1.0, 0.0])  # Meta-World writes it unnormalised
CONTROL_SPEC: Final[int] = (int(mujoco.mjtState.mjSTATE_CTRL) | int(mujoco.mjtState.mjSTATE_MOCAP_POS)
                            | int(mujoco.mjtState.mjSTATE_MOCAP_QUAT) | int(mujoco.mjtState.mjSTATE_EQ_ACTIVE))


# Tasks whose Meta-World reset ends without an mj_forward after the hand reset: their first observation
# shows the kinematics one MuJoCo step before the end of the hand reset (reproduced).
STALE_RESET_OBSERVATION: Final[frozenset[str]] = frozenset({"window-open", "faucet-open", "window-close",
                                                            "door-lock"})
# Extra MuJoCo steps some resets run after the hand reset (door-lock steps the simulation once more).
EXTRA_RESET_STEPS: Final[dict[str, int]] = {"door-lock": FRAME_SKIP}


def _fixture_positions(task: TaskSpec, rand: np.ndarray) -> list[np.ndarray]:
    """Positions of the task's fixtures (``task.scene.fixtures`` order) for a random vector."""
    name = task.name
    if name in ("button-press", "door-unlock", "door-open", "window-open", "faucet-open", "coffee-button",
                "button-press-wall", "door-lock", "door-close", "window-close", "faucet-close"):
        return [rand[:3].copy()]
    if name in ("coffee-push", "make-coffee"):
        return [rand[3:6] + np.array([0.0, 0.22, 0.0])]
    if name == "soccer":
        return [rand[3:6].copy()]
    if name == "locked-door-open":
        return [rand[:3].copy()]
    if task.scene.fixtures:
        raise NotImplementedError(f"no fixture placement for task {name!r}")
    return []


class MetaWorldHost:
    """All task models, their batched stepper and the reset; one per process (see :func:`get_host`).

    Row ``i`` of a call uses the model of task ``task[i]`` (one model per task, compiled from its scene).
    Control vector of a task: ``[ctrl (2) | mocap_pos (3·nmocap) | mocap_quat (4·nmocap) | eq_active (neq)]``,
    padded; the hand's mocap and the fixtures' are at the indices in :attr:`hand_mocap` /
    :attr:`fixture_mocaps`; ``eq_active`` carries the locked door's latch (see :meth:`controls64`).
    """

    def __init__(self, nthread: int | None = None, *, mjx_friendly: bool = False) -> None:
        self.mjx_friendly = bool(mjx_friendly)
        self.models = tuple(scenes.build_model(t.scene, mjx_friendly=self.mjx_friendly) for t in TASKS)
        self.stepper = HostStepper(self.models, FRAME_SKIP, control_spec=CONTROL_SPEC, nthread=nthread, readout=True)
        self.state_width = self.stepper.state_width
        self.control_width = self.stepper.control_width
        ids = [scenes.mocap_ids(m, t.scene) for m, t in zip(self.models, TASKS)]
        self.hand_mocap = tuple(h for h, _ in ids)
        self.fixture_mocaps = tuple(f for _, f in ids)
        self.control_layouts = tuple(state_layout(m, CONTROL_SPEC) for m in self.models)
        self.state_layouts = tuple(state_layout(m, FULLPHYSICS) for m in self.models)
        self._datas = [mujoco.MjData(m) for m in self.models]
        self._lock = threading.Lock()
        self._hand_cols = self.hand_mocap_columns().astype(np.int64)
        self._quat_cols = self.hand_quat_columns().astype(np.int64)
        self._mocap_low = np.array([t.hand_low for t in TASKS], np.float64)
        self._mocap_high = np.array([t.hand_high for t in TASKS], np.float64)
        # Latch rules (locked-door-open): (task, control column of the hold's eq_active, state index of the
        # lock's qpos); the hold stays active while the lock angle exceeds scenes.LOCK_RELEASE_ANGLE.
        self._latches = []
        for k, t in enumerate(TASKS):
            if t.scene.edit == "locked_door":
                m = self.models[k]
                eq = m.equality(scenes.LOCKED_DOOR_HOLD).id
                lock_joint = m.body("lock_link").jntadr[0]
                self._latches.append((k, self.control_layouts[k]["eq_active"].start + eq,
                                      self.state_layouts[k]["qpos"].start + m.jnt_qposadr[lock_joint]))

    # ------------------------------------------------------------------ control vectors
    def hand_mocap_slice(self, task: int) -> slice:
        """Slice of the hand's mocap position inside task ``task``'s control vector."""
        start = self.control_layouts[task]["mocap_pos"].start + 3 * self.hand_mocap[task]
        return slice(start, start + 3)

    def hand_mocap_columns(self) -> np.ndarray:
        """(K, 3) int: control columns of the hand's mocap position, per task."""
        return np.array([np.arange(self.hand_mocap_slice(k).start, self.hand_mocap_slice(k).stop)
                         for k in range(len(TASKS))], np.int32)

    def hand_quat_columns(self) -> np.ndarray:
        """(K, 4) int: control columns of the hand's mocap quaternion, per task."""
        out = []
        for k in range(len(TASKS)):
            start = self.control_layouts[k]["mocap_quat"].start + 4 * self.hand_mocap[k]
            out.append(np.arange(start, start + 4))
        return np.array(out, np.int32)

    def _control(self, task: int, data: mujoco.MjData) -> np.ndarray:
        out = np.zeros(self.control_width)
        out[: mujoco.mj_stateSize(self.models[task], CONTROL_SPEC)] = self._get(task, data, CONTROL_SPEC)
        return out

    def _get(self, task: int, data: mujoco.MjData, spec: int) -> np.ndarray:
        m = self.models[task]
        out = np.empty(mujoco.mj_stateSize(m, spec))
        mujoco.mj_getState(m, data, out, spec)
        return out

    # ------------------------------------------------------------------ reset
    def reset_settle64(self, task: np.ndarray, rand: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The reset up to the task's writes: the hand settled.

        Args:
          task: (N,) int task ids; rand: (N, RAND_DIM) random vectors.
        Returns: float64 state (N, S) at the end of the reset's stepping, control (N, C), the sensors MuJoCo
          left right after ``_reset_hand`` (N, SENSOR_DIM) and at the end of the stepping (N, SENSOR_DIM).
        """
        task = np.asarray(task, np.int64).reshape(-1)
        rand = np.asarray(rand, np.float64).reshape(task.size, RAND_DIM)
        n = task.size
        state = np.zeros((n, self.state_width))
        control = np.zeros((n, self.control_width))
        with self._lock:
            # 1-2: default state, fixtures placed, hand mocap at hand_init, gripper control (-1, 1).
            for i, k in enumerate(task):
                m, d, spec = self.models[k], self._datas[k], TASKS[k]
                mujoco.mj_resetData(m, d)
                for mocap, pos in zip(self.fixture_mocaps[k], _fixture_positions(spec, rand[i])):
                    d.mocap_pos[mocap] = pos
                d.mocap_pos[self.hand_mocap[k]] = spec.hand_init
                d.mocap_quat[self.hand_mocap[k]] = HAND_QUAT
                d.ctrl[:] = (-1.0, 1.0)
                s = self._get(k, d, FULLPHYSICS)
                state[i, : s.size] = s
                control[i] = self._control(k, d)
        # 3: _reset_hand (and the extra steps of some tasks), batched on the thread pool.
        extra = max(EXTRA_RESET_STEPS.values())
        states, sensors_t = self.stepper.trajectory64(state, control, task, nstep=RESET_STEPS + extra)
        end = RESET_STEPS - 1 + np.array([EXTRA_RESET_STEPS.get(TASKS[k].name, 0) for k in task])
        state = states[np.arange(n), end]
        stale = sensors_t[:, RESET_STEPS - 1]          # MjData right after _reset_hand (no mj_forward)
        stale_end = sensors_t[np.arange(n), end]       # MjData at the end of the reset's stepping
        return state, control, stale, stale_end

    def reset64(self, task: np.ndarray, rand: np.ndarray) -> dict[str, np.ndarray]:
        """Meta-World's reset of each row.

        Args:
          task: (N,) int task ids.
          rand: (N, RAND_DIM) random vectors (each task reads its first ``len(rand_low)`` entries).
        Returns: float64 arrays ``state`` (N, S), ``control`` (N, C), ``consts`` (N, CONST_DIM) and
          ``sensors`` (N, SENSOR_DIM) on the reset state.
        """
        task = np.asarray(task, np.int64).reshape(-1)
        rand = np.asarray(rand, np.float64).reshape(task.size, RAND_DIM)
        n = task.size
        state, control, stale, stale_end = self.reset_settle64(task, rand)
        consts = np.zeros((n, CONST_DIM))
        sensors = np.zeros((n, scenes.SENSOR_DIM))
        sl = scenes.sensor_slices()
        with self._lock:
            for i, k in enumerate(task):
                m, d = self.models[k], self._datas[k]
                mujoco.mj_setState(m, d, state[i, : self.stepper.state_sizes[k]], FULLPHYSICS)
                mujoco.mj_setState(m, d, control[i, : self.stepper.control_sizes[k]], CONTROL_SPEC)
                mujoco.mj_forward(m, d)  # positions as if Meta-World had run mj_forward (used only where it does)
                init_tcp = 0.5 * (stale[i, sl["ree"]] + stale[i, sl["lee"]])
                c = self._task_reset(k, d, rand[i], stale[i], init_tcp)
                consts[i] = c
                s = self._get(k, d, FULLPHYSICS)
                state[i] = 0.0
                state[i, : s.size] = s
                control[i] = self._control(k, d)
                # Tasks whose reset ends without an mj_forward observe the stale kinematics.
                sensors[i] = stale_end[i] if TASKS[k].name in STALE_RESET_OBSERVATION else d.sensordata
        return {"state": state, "control": control, "consts": consts, "sensors": sensors}

    def _set_state(self, k: int, d: mujoco.MjData, qpos: np.ndarray, qvel: np.ndarray) -> None:
        """Gymnasium's ``MujocoEnv.set_state``: write qpos and qvel, then ``mj_forward``."""
        d.qpos[:] = qpos
        d.qvel[:] = qvel
        mujoco.mj_forward(self.models[k], d)

    def _task_reset(self, k: int, d: mujoco.MjData, rand: np.ndarray, stale: np.ndarray, init_tcp: np.ndarray
                    ) -> np.ndarray:
        """Step 4 of the reset for task ``k`` on ``d`` (state after ``_reset_hand``); returns the constants."""
        spec = TASKS[k]
        name = spec.name
        sl = scenes.sensor_slices()
        m = self.models[k]
        c = np.zeros(CONST_DIM)
        c[6:9] = init_tcp
        c[9:12] = stale[sl["lpad"]]
        c[12:15] = stale[sl["rpad"]]
        qpos, qvel = d.qpos.copy(), d.qvel.copy()
        if name in ("reach", "push", "pick-place", "reach-wall", "push-wall", "pick-place-wall"):
            if name in ("push", "push-wall"):  # the puck keeps its settled height (read before any forward)
                obj_init = np.array([rand[0], rand[1], stale[sl["obj"]][2]])
                target = np.array([rand[3], rand[4], obj_init[2]])
            else:
                obj_init, target = rand[0:3].copy(), rand[3:6].copy()
            qpos[9:12] = obj_init
            qvel[9:15] = 0.0
            self._set_state(k, d, qpos, qvel)
            c[0:3], c[3:6] = target, obj_init
        elif name in ("button-press", "button-press-wall"):
            qpos[9], qvel[9] = 0.0, 0.0
            self._set_state(k, d, qpos, qvel)
            hole = d.site("hole").xpos.copy()
            c[0:3], c[3:6] = hole, rand[0:3]
            c[15] = abs(hole[1] - d.site("buttonStart").xpos[1])
        elif name == "door-unlock":
            qpos[9], qvel[9] = 1.5708, 0.0
            self._set_state(k, d, qpos, qvel)
            obj_init = d.body("lock_link").xpos.copy()
            c[0:3], c[3:6] = obj_init + np.array([0.1, -0.04, 0.0]), obj_init
        elif name == "door-open":
            obj_init = rand[0:3].copy()
            adr = m.joint("doorjoint").qposadr.item()
            qpos[adr], qvel[m.joint("doorjoint").dofadr.item()] = 0.0, 0.0
            self._set_state(k, d, qpos, qvel)
            c[0:3], c[3:6] = obj_init + np.array([-0.3, -0.45, 0.0]), obj_init
        elif name == "window-open":
            obj_init = rand[0:3].copy()
            c[0:3], c[3:6] = obj_init + np.array([0.2, 0.0, 0.0]), obj_init
            c[15:18] = stale[sl["obj"]]  # window_handle_pos_init, read before any mj_forward
            d.qpos[m.joint("window_slide").qposadr.item()] = 0.0
        elif name == "faucet-open":
            obj_init = rand[0:3].copy()
            c[0:3], c[3:6] = obj_init + np.array([0.175, 0.0, 0.125]), obj_init
        elif name in ("coffee-push", "make-coffee"):
            mug_init, mug_goal = rand[0:3].copy(), rand[3:6].copy()
            qpos[0:3] = mug_init
            qvel[9:15] = 0.0
            self._set_state(k, d, qpos, qvel)
            c[0:3], c[3:6] = mug_goal, mug_init
        elif name == "coffee-button":
            obj_init = rand[0:3].copy()
            qpos[0:3] = obj_init + np.array([0.0, -0.22, 0.0])
            qvel[9:15] = 0.0
            self._set_state(k, d, qpos, qvel)
            c[0:3] = obj_init + np.array([0.0, -0.22, 0.3]) + np.array([0.0, 0.03, 0.0])
            c[3:6] = obj_init
        elif name == "hammer":
            qpos[9:12] = rand[0:3]
            qvel[9:15] = 0.0
            target = stale[sl["extra"]].copy()  # the goal site, read before any mj_forward
            self._set_state(k, d, qpos, qvel)
            c[0:3], c[3:6] = target, rand[0:3]
        elif name == "soccer":
            obj_init = np.array([rand[0], rand[1], 0.03])
            qpos[9:12] = obj_init
            qvel[9:15] = 0.0
            self._set_state(k, d, qpos, qvel)
            c[0:3], c[3:6] = rand[3:6], obj_init
        elif name == "locked-door-open":
            lock = m.body("lock_link").jntadr[0]
            qpos[m.jnt_qposadr[lock]], qvel[m.jnt_dofadr[lock]] = 1.5708, 0.0
            door = m.joint("doorjoint")
            qpos[door.qposadr.item()], qvel[door.dofadr.item()] = 0.0, 0.0
            self._set_state(k, d, qpos, qvel)
            c[0:3], c[3:6] = rand[0:3] + np.array([-0.3, -0.45, 0.0]), rand[0:3]
            c[15:18] = d.body("lock_link").xpos
        elif name == "door-lock":
            obj_init = d.body("lock_link").xpos.copy()
            c[0:3], c[3:6] = obj_init + np.array([0.0, -0.04, -0.1]), obj_init
        elif name == "door-close":
            obj_init = rand[0:3].copy()
            qpos[m.joint("doorjoint").qposadr.item()], qvel[m.joint("doorjoint").dofadr.item()] = -1.5708, 0.0
            self._set_state(k, d, qpos, qvel)
            c[0:3], c[3:6] = obj_init + np.array([0.2, -0.2, 0.0]), obj_init
        elif name == "window-close":
            obj_init = rand[0:3].copy()
            c[0:3], c[3:6] = obj_init, obj_init
            c[15:18] = stale[sl["obj"]] + np.array([0.2, 0.0, 0.0])
            d.qpos[m.joint("window_slide").qposadr.item()] = 0.2
        elif name == "faucet-close":
            obj_init = rand[0:3].copy()
            c[0:3], c[3:6] = obj_init + np.array([-0.175, 0.0, 0.125]), obj_init
            mujoco.mj_forward(m, d)
        else:
            raise NotImplementedError(f"no reset for task {name!r}")
        return c

    # ------------------------------------------------------------------ step
    def controls64(self, control: np.ndarray, action: np.ndarray, task: np.ndarray,
                   state: np.ndarray | None = None) -> np.ndarray:
        """Meta-World's ``set_xyz_action`` + gripper control on float64 control vectors.

        Args:
          control: (N, C) current control vectors (the hand's mocap holds its current target).
          action: (N, 4) float32 actions.
          task: (N,) int task ids.
        Returns: (N, C) new controls: hand mocap ``clip(mocap + clip(a[:3], -1, 1) * 0.01, low, high)`` (the
        delta rounded to float32 first, as NumPy does in Meta-World), mocap quaternion (1, 0, 1, 0),
        actuators ``(a[3], -a[3])``; with ``state`` (N, S), the latch rule of locked-door-open (the door's
        hold is released for good once the lock's angle drops below ``scenes.LOCK_RELEASE_ANGLE``).
        """
        control = np.array(control, np.float64, copy=True)
        action = np.asarray(action, np.float32)
        rows = np.arange(task.size)[:, None]
        cols = self._hand_cols[task]
        delta = (np.clip(action[:, :3], -1.0, 1.0) * np.float32(0.01)).astype(np.float64)
        control[rows, cols] = np.clip(control[rows, cols] + delta, self._mocap_low[task], self._mocap_high[task])
        control[rows, self._quat_cols[task]] = HAND_QUAT
        control[:, 0] = action[:, 3]
        control[:, 1] = -action[:, 3].astype(np.float64)
        if state is not None:
            for k, col, qpos in self._latches:
                rows_k = task == k
                if rows_k.any():
                    held = (control[rows_k, col] > 0) & (state[rows_k, qpos] > scenes.LOCK_RELEASE_ANGLE)
                    control[rows_k, col] = held.astype(np.float64)
        return control

    def step64(self, state: np.ndarray, control: np.ndarray, action: np.ndarray, task: np.ndarray,
               active: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One environment step of the ``active`` rows (others are returned unchanged with zero sensors).

        Returns: state' (N, S), control' (N, C), sensors (N, SENSOR_DIM), all float64.
        """
        task = np.asarray(task, np.int64).reshape(-1)
        active = np.ones(task.size, bool) if active is None else np.asarray(active, bool).reshape(-1)
        new_control = control.copy()
        new_state = state.copy()
        sensors = np.zeros((task.size, scenes.SENSOR_DIM))
        rows = np.flatnonzero(active)
        if rows.size:
            new_control[rows] = self.controls64(control[rows], action[rows], task[rows], state[rows])
            new_state[rows], sensors[rows] = self.stepper.step64(state[rows], new_control[rows], task[rows])
        return new_state, new_control, sensors

    # ------------------------------------------------------------------ pure_callback bodies (bit-exact state)
    def _step_callback(self, state_bits: np.ndarray, control_bits: np.ndarray, action: np.ndarray,
                       task: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lead = np.shape(task)
        n = int(np.prod(lead))
        state = unpack64(np.reshape(state_bits, (n, self.state_width, 2)))
        control = unpack64(np.reshape(control_bits, (n, self.control_width, 2)))
        new_state, new_control, sensors = self.step64(state, control, np.reshape(action, (n, 4)),
                                                      np.reshape(task, n), np.reshape(active, n))
        return (pack64(new_state).reshape(lead + (self.state_width, 2)),
                pack64(new_control).reshape(lead + (self.control_width, 2)),
                sensors.astype(np.float32).reshape(lead + (scenes.SENSOR_DIM,)))

    def _reset_callback(self, task: np.ndarray, rand: np.ndarray) -> tuple[np.ndarray, ...]:
        """Reset rows → state and control (float64 bit patterns), constants and sensors (float32)."""
        lead = np.shape(task)
        n = int(np.prod(lead))
        out = self.reset64(np.reshape(task, n), np.reshape(rand, (n, RAND_DIM)))
        return (pack64(out["state"]).reshape(lead + (self.state_width, 2)),
                pack64(out["control"]).reshape(lead + (self.control_width, 2)),
                out["consts"].astype(np.float32).reshape(lead + (CONST_DIM,)),
                out["sensors"].astype(np.float32).reshape(lead + (scenes.SENSOR_DIM,)))


_HOSTS: dict[tuple[int | None, bool], MetaWorldHost] = {}
_HOSTS_LOCK = threading.Lock()


def get_host(nthread: int | None = None, *, mjx_friendly: bool = False) -> MetaWorldHost:
    """The process-wide :class:`MetaWorldHost` with ``nthread`` C threads (default: all usable CPUs), on
    Meta-World's models or (``mjx_friendly``) on the MJX-friendly ones of :mod:`.mjx_model`."""
    key = (nthread, bool(mjx_friendly))
    with _HOSTS_LOCK:
        if key not in _HOSTS:
            _HOSTS[key] = MetaWorldHost(nthread, mjx_friendly=mjx_friendly)
        return _HOSTS[key]
