"""The MJX physics of Meta-World: the environment step *and* the reset of a batch in pure JAX
(``jit``/``vmap``/``scan``), on :mod:`.mjx_model`'s models with the host's state and control layouts in
float32.

The kernel (:meth:`MjxPhysics.advance`) runs ``n`` ``mjx.step`` calls per row with its controls held from a
zero warm start and returns the final state, its observables and the stale sensors of the state before
the last step. A step is :func:`controls` then the kernel with ``n = FRAME_SKIP``; a reset is the host's
procedure (``mjx.make_data``, fixtures, ``RESET_STEPS`` of settling, :data:`TASK_RESETS`). A row picks its
task's model with ``lax.switch``, which under ``vmap`` evaluates every compiled model, so
:class:`MjxPhysics` takes the tasks it serves. Agreement with MuJoCo C and speed: docs/metaworld_mjx.md.
"""

from __future__ import annotations

from typing import Callable, Final, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from imaginejax.envs.metaworld import scenes
from imaginejax.envs.metaworld.host import (EXTRA_RESET_STEPS, FRAME_SKIP, HAND_QUAT, RESET_STEPS,
                                            STALE_RESET_OBSERVATION, MetaWorldHost, _fixture_positions)
from imaginejax.envs.mujoco_host import FULLPHYSICS
from imaginejax.envs.metaworld.tasks import CONST_DIM, MOCAP_HIGH, MOCAP_LOW, RAND_DIM, TASK_INDEX, TASKS

__all__ = ["Advance", "MjxPhysics", "TASK_RESETS", "TaskReset", "controls", "task_names"]

_NO_LATCH: Final[int] = -1


def task_names(tasks: Sequence[str] | None) -> tuple[str, ...]:
    """The validated task names (None: all :data:`.tasks.TASKS`).

    Raises: ValueError naming the unknown tasks and the valid names (also for an empty selection).
    """
    names = tuple(t.name for t in TASKS) if tasks is None else tuple(tasks)
    unknown = [n for n in names if n not in TASK_INDEX]
    if unknown or not names:
        raise ValueError(f"tasks must name Meta-World tasks, got {unknown or names}; valid: {', '.join(TASK_INDEX)}")
    return names


# ---------------------------------------------------------------------------------------------- task resets
class Kin(NamedTuple):
    """Positions of a row's model after ``mjx.kinematics``: ``site(name)`` / ``body(name)`` → (3,) world
    position (``site_xpos`` / ``xpos``, what MuJoCo's ``data.site(name).xpos`` / ``data.body(name).xpos`` read)."""

    site: Callable[[str], jax.Array]
    body: Callable[[str], jax.Array]


class TaskReset(NamedTuple):
    """Step 3 of the reset of one task (host.py's ``_task_reset``, in JAX).

    Attributes:
      write: ``(m, qpos (nq,), qvel (nv,), rand (RAND_DIM,), stale (39,)) → (qpos, qvel)``: the task's writes
        on the settled state (``m`` the task's ``MjModel`` for joint addresses).
      consts: ``(m, kin, rand, stale, consts (CONST_DIM,)) → consts``: the task's constants (entries 0:6 and
        15:18; 6:15 hold ``init_tcp`` and the pads already); ``kin`` reads the written state's kinematics.
    """

    write: Callable[..., tuple[jax.Array, jax.Array]]
    consts: Callable[..., jax.Array]


def _v(*x: float) -> np.ndarray:
    return np.array(x, np.float64)


def _keep(m, qpos, qvel, rand, stale):
    return qpos, qvel


def _joint(m: mujoco.MjModel, name: str) -> tuple[int, int]:
    """(qpos address, dof address) of a named joint."""
    j = m.joint(name)
    return int(j.qposadr.item()), int(j.dofadr.item())


def _lock_joint(m: mujoco.MjModel) -> tuple[int, int]:
    """(qpos address, dof address) of the lock's (unnamed) hinge."""
    j = int(m.body("lock_link").jntadr[0])
    return int(m.jnt_qposadr[j]), int(m.jnt_dofadr[j])


def _target_init(target: jax.Array, init: jax.Array) -> Callable[[jax.Array], jax.Array]:
    return lambda c: c.at[0:3].set(target).at[3:6].set(init)


_SL: Final[dict[str, slice]] = scenes.sensor_slices()


def _obj_write(m, qpos, qvel, rand, stale):  # reach, pick-place (and -wall): the object at rand[0:3]
    return qpos.at[9:12].set(rand[0:3]), qvel.at[9:15].set(0.0)


def _push_init(rand, stale):  # the puck keeps its settled height (read before any forward)
    return jnp.stack([rand[0], rand[1], stale[_SL["obj"]][2]])


def _push_write(m, qpos, qvel, rand, stale):
    return qpos.at[9:12].set(_push_init(rand, stale)), qvel.at[9:15].set(0.0)


def _push_consts(m, kin, rand, stale, c):
    init = _push_init(rand, stale)
    return _target_init(jnp.stack([rand[3], rand[4], init[2]]), init)(c)


def _set_joint(name: str | int | None, value: float):
    """Write ``value`` to a joint's qpos and 0 to its velocity: a joint name, None (the lock's hinge) or an
    int (qpos and qvel index, as Meta-World writes the button's and door-unlock's lock's)."""
    def write(m, qpos, qvel, rand, stale):
        if isinstance(name, int):
            q = v = name
        else:
            q, v = _lock_joint(m) if name is None else _joint(m, name)
        return qpos.at[q].set(value), qvel.at[v].set(0.0)
    return write


def _button_consts(m, kin, rand, stale, c):
    hole = kin.site("hole")
    c = _target_init(hole, rand[0:3])(c)
    return c.at[15].set(jnp.abs(hole[1] - kin.site("buttonStart")[1]))


def _offset_consts(offset: tuple[float, float, float]):
    """target = rand[0:3] + offset, initial position rand[0:3]."""
    return lambda m, kin, rand, stale, c: _target_init(rand[0:3] + _v(*offset), rand[0:3])(c)


def _lock_consts(offset: tuple[float, float, float]):
    """target = lock_link + offset, initial position lock_link (door-unlock, door-lock)."""
    def consts(m, kin, rand, stale, c):
        init = kin.body("lock_link")
        return _target_init(init + _v(*offset), init)(c)
    return consts


def _window_write(value: float):
    def write(m, qpos, qvel, rand, stale):  # after the constants, without a forward (observation stale)
        return qpos.at[_joint(m, "window_slide")[0]].set(value), qvel
    return write


def _mug_write(shift: tuple[float, float, float]):  # coffee scenes: the mug's free joint comes first
    def write(m, qpos, qvel, rand, stale):
        return qpos.at[0:3].set(rand[0:3] + _v(*shift)), qvel.at[9:15].set(0.0)
    return write


def _soccer_init(rand):
    return jnp.stack([rand[0], rand[1], jnp.asarray(0.03, rand.dtype)])


def _locked_door_write(m, qpos, qvel, rand, stale):
    qpos, qvel = _set_joint(None, 1.5708)(m, qpos, qvel, rand, stale)
    return _set_joint("doorjoint", 0.0)(m, qpos, qvel, rand, stale)


def _locked_door_consts(m, kin, rand, stale, c):
    return _offset_consts((-0.3, -0.45, 0.0))(m, kin, rand, stale, c).at[15:18].set(kin.body("lock_link"))


_OBJECT = TaskReset(_obj_write, lambda m, kin, rand, stale, c: _target_init(rand[3:6], rand[0:3])(c))
_PUSH = TaskReset(_push_write, _push_consts)
_BUTTON = TaskReset(_set_joint(9, 0.0), _button_consts)

# One entry per task: host.py's ``_task_reset`` branch of the same name, in JAX (tested against it).
TASK_RESETS: Final[dict[str, TaskReset]] = {
    "reach": _OBJECT, "pick-place": _OBJECT, "reach-wall": _OBJECT, "pick-place-wall": _OBJECT,
    "push": _PUSH, "push-wall": _PUSH,
    "button-press": _BUTTON, "button-press-wall": _BUTTON,
    "door-unlock": TaskReset(_set_joint(9, 1.5708), _lock_consts((0.1, -0.04, 0.0))),
    "door-open": TaskReset(_set_joint("doorjoint", 0.0), _offset_consts((-0.3, -0.45, 0.0))),
    "window-open": TaskReset(_window_write(0.0), lambda m, kin, rand, stale, c: _offset_consts((0.2, 0.0, 0.0))(
        m, kin, rand, stale, c).at[15:18].set(stale[_SL["obj"]])),
    "faucet-open": TaskReset(_keep, _offset_consts((0.175, 0.0, 0.125))),
    "coffee-push": TaskReset(_mug_write((0.0, 0.0, 0.0)),
                             lambda m, kin, rand, stale, c: _target_init(rand[3:6], rand[0:3])(c)),
    "coffee-button": TaskReset(_mug_write((0.0, -0.22, 0.0)), lambda m, kin, rand, stale, c: _target_init(
        rand[0:3] + _v(0.0, -0.22, 0.3) + _v(0.0, 0.03, 0.0), rand[0:3])(c)),
    "hammer": TaskReset(_obj_write, lambda m, kin, rand, stale, c: _target_init(stale[_SL["extra"]], rand[0:3])(c)),
    "soccer": TaskReset(lambda m, qpos, qvel, rand, stale: (qpos.at[9:12].set(_soccer_init(rand)),
                                                             qvel.at[9:15].set(0.0)),
                        lambda m, kin, rand, stale, c: _target_init(rand[3:6], _soccer_init(rand))(c)),
    "locked-door-open": TaskReset(_locked_door_write, _locked_door_consts),
    "door-lock": TaskReset(_keep, _lock_consts((0.0, -0.04, -0.1))),
    "door-close": TaskReset(_set_joint("doorjoint", -1.5708), _offset_consts((0.2, -0.2, 0.0))),
    "window-close": TaskReset(_window_write(0.2), lambda m, kin, rand, stale, c: _target_init(
        rand[0:3], rand[0:3])(c).at[15:18].set(stale[_SL["obj"]] + _v(0.2, 0.0, 0.0))),
    "faucet-close": TaskReset(_keep, _offset_consts((-0.175, 0.0, 0.125))),
}
TASK_RESETS["make-coffee"] = TASK_RESETS["coffee-push"]


class Advance(NamedTuple):
    """Output of the physics kernel (:meth:`MjxPhysics.advance`), batched: phys (B, S) the state after the
    steps; sensors (B, 39) its observables; stale (B, 39) the sensors MuJoCo left after the last step (the
    state before it)."""

    phys: jax.Array
    sensors: jax.Array
    stale: jax.Array


class MjxPhysics:
    """MJX models of some tasks, their batched step and reset.

    Args:
      host: the :class:`.host.MetaWorldHost` on the MJX-friendly models (``get_host(mjx_friendly=True)``):
        its models, padded widths and control columns are used.
      tasks: names of the tasks whose models this physics compiles in (default: all).
      dtype: float32 (the environment's), or float64 with ``jax_enable_x64`` (diagnostics).
      chunk: rows simulated together: a batch runs as ``ceil(B / chunk)`` vmapped chunks one after another;
        None: all rows in one vmap (accelerators). Results do not depend on it; on a CPU use 1–4
        (docs/metaworld_mjx.md).
    Attributes:
      kernel: ``jax.jit(advance)``: eager callers (the reset's settling, the step, tests) share its compiled
        program per batch size; inside an outer ``jit`` it is inlined.
    Raises:
      ValueError: a host on Meta-World's original models, or an unknown task name (the valid names are listed).
    """

    def __init__(self, host: MetaWorldHost, tasks: Sequence[str] | None = None, dtype: type = jnp.float32,
                 chunk: int | None = None) -> None:
        from mujoco import mjx  # imported lazily: heavy, and only this backend needs it

        if not host.mjx_friendly:
            raise ValueError("MjxPhysics needs the host of the MJX-friendly models: get_host(mjx_friendly=True)")
        self.dtype = jnp.dtype(dtype)
        if self.dtype not in (jnp.float32, jnp.float64):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype}")
        if self.dtype == jnp.float64 and not jax.config.jax_enable_x64:
            raise ValueError("dtype float64 needs jax_enable_x64 (jax.config.update('jax_enable_x64', True) "
                             "before any JAX array is made)")
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1):
            raise ValueError(f"chunk must be a positive number of rows or None (all rows at once), got {chunk!r}")
        self.chunk = None if chunk is None else int(chunk)
        names = task_names(tasks)
        self.tasks = names
        self.task_ids = tuple(TASK_INDEX[n] for n in names)
        self.state_width, self.control_width = host.state_width, host.control_width
        self.models = tuple(host.models[k] for k in self.task_ids)
        with jax.ensure_compile_time_eval():
            self.mjx_models = tuple(mjx.put_model(m) for m in self.models)
        branch = np.full(len(TASKS), -1, np.int32)
        branch[list(self.task_ids)] = np.arange(len(names))
        self.branch_of_task = branch
        self.state_layouts = tuple(host.state_layouts[k] for k in self.task_ids)
        self.control_layouts = tuple(host.control_layouts[k] for k in self.task_ids)
        self.hand_mocaps = tuple(host.hand_mocap[k] for k in self.task_ids)
        self.fixture_mocaps = tuple(host.fixture_mocaps[k] for k in self.task_ids)
        rest = mujoco.MjData(self.models[0])  # the first model at rest (mj_resetData): see advance
        self._idle_phys = np.zeros(self.state_width)
        self._idle_phys[: self.state_layouts[0]["qvel"].stop] = host._get(self.task_ids[0], rest, FULLPHYSICS)
        self._idle_ctrl = host._control(self.task_ids[0], rest)
        self.mocap_bodies = tuple(np.argsort(np.where(m.body_mocapid >= 0, m.body_mocapid, m.nbody + 1))[: m.nmocap]
                                  for m in self.models)  # per model: body id of each mocap id
        # Per-task control columns (all tasks, the host's): hand mocap position and quaternion, latch.
        self.hand_pos_cols = host.hand_mocap_columns()    # (K, 3)
        self.hand_quat_cols = host.hand_quat_columns()    # (K, 4)
        self.latch_cols = np.full(len(TASKS), _NO_LATCH, np.int32)  # (K,) eq_active column of the latch
        self.latch_qpos = np.zeros(len(TASKS), np.int32)            # (K,) state index of the lock's angle
        for k, col, qpos in host._latches:
            self.latch_cols[k], self.latch_qpos[k] = col, qpos
        for layout in self.state_layouts:
            extra = [k for k, s in layout.items() if k not in ("time", "qpos", "qvel") and s.stop > s.start]
            if extra:
                raise ValueError(f"Meta-World model with FULLPHYSICS components {extra} the MJX kernel does not carry")
        self.kernel = jax.jit(self.advance)

    def __repr__(self) -> str:
        return f"MjxPhysics(tasks={self.tasks}, chunk={self.chunk})"

    # ------------------------------------------------------------------ vectors <-> mjx.Data of one row
    def _model(self, branch: int, ctrl: jax.Array):
        """The ``mjx.Model`` of model ``branch`` for a row with control vector ``ctrl`` (C,): each mocap body's
        ``body_pos``/``body_quat`` set to the row's mocap pose.

        Why: ``mjx.kinematics`` builds the body tree from ``body_pos``/``body_quat`` before it applies the mocap
        poses, so a mocap body's descendants (every Meta-World fixture's parts) would stay at their file
        positions; MuJoCo C starts the tree from the mocap pose (docs/metaworld_mjx.md).
        """
        m, mx = self.models[branch], self.mjx_models[branch]
        if m.nmocap == 0:
            return mx
        cl = self.control_layouts[branch]
        bodies = self.mocap_bodies[branch]  # (nmocap,) body id of each mocap id
        pos = ctrl[cl["mocap_pos"]].reshape(m.nmocap, 3)
        quat = ctrl[cl["mocap_quat"]].reshape(m.nmocap, 4)
        quat = quat / jnp.linalg.norm(quat, axis=-1, keepdims=True)  # MuJoCo normalises mocap_quat too
        return mx.replace(body_pos=jnp.asarray(mx.body_pos, pos.dtype).at[bodies].set(pos),
                          body_quat=jnp.asarray(mx.body_quat, quat.dtype).at[bodies].set(quat))

    def _data(self, branch: int, phys: jax.Array, ctrl: jax.Array):
        """``mjx.Data`` of one row of model ``branch``: phys (S,) state vector, ctrl (C,) control vector."""
        from mujoco import mjx

        m, mx = self.models[branch], self.mjx_models[branch]
        sl, cl = self.state_layouts[branch], self.control_layouts[branch]
        return mjx.make_data(mx).replace(
            time=phys[sl["time"]][0], qpos=phys[sl["qpos"]], qvel=phys[sl["qvel"]], ctrl=ctrl[cl["ctrl"]],
            eq_active=ctrl[cl["eq_active"]] > 0.5,
            mocap_pos=ctrl[cl["mocap_pos"]].reshape(m.nmocap, 3),
            mocap_quat=ctrl[cl["mocap_quat"]].reshape(m.nmocap, 4))

    def _phys_vector(self, branch: int, data, like: jax.Array) -> jax.Array:
        """(S,) state vector of ``data``; entries past the model's own (padding) are taken from ``like``."""
        size = self.state_layouts[branch]["qvel"].stop
        new = jnp.concatenate([data.time[None], data.qpos, data.qvel]).astype(like.dtype)
        return jnp.concatenate([new, like[size:]])

    def _ctrl_vector(self, branch: int, data) -> jax.Array:
        """(C,) control vector of ``data`` (zero padding)."""
        cl = self.control_layouts[branch]
        out = jnp.zeros(self.control_width, self.dtype)
        out = out.at[cl["ctrl"]].set(data.ctrl).at[cl["eq_active"]].set(data.eq_active.astype(self.dtype))
        return out.at[cl["mocap_pos"]].set(data.mocap_pos.reshape(-1)).at[cl["mocap_quat"]].set(
            data.mocap_quat.reshape(-1))

    def _sensors(self, mx, data) -> jax.Array:
        """(39,) position observables of ``data``'s qpos on model ``mx`` (``mjx.kinematics`` + ``mjx.sensor_pos``)."""
        from mujoco import mjx

        return mjx.sensor_pos(mx, mjx.kinematics(mx, data)).sensordata[: scenes.SENSOR_DIM].astype(self.dtype)

    def _switch(self, fn: Callable[..., tuple], task: jax.Array, *args: jax.Array) -> tuple:
        """``fn(branch, *args)`` with the row's model (one row; ``lax.switch`` over the compiled models); rows of
        tasks not compiled in come back NaN (``fn`` returns float arrays)."""
        branch = jnp.asarray(self.branch_of_task)[task]
        if len(self.models) == 1:
            out = fn(0, *args)
        else:
            fns = [lambda *a, b=b: fn(b, *a) for b in range(len(self.models))]
            out = jax.lax.switch(jnp.maximum(branch, 0), fns, *args)
        return jax.tree.map(lambda a: jnp.where(branch >= 0, a, jnp.full_like(a, jnp.nan)), out)

    # ------------------------------------------------------------------ the physics kernel
    def _advance_one(self, branch: int, phys: jax.Array, ctrl: jax.Array, nsteps: jax.Array
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
        from mujoco import mjx

        mx = self._model(branch, ctrl)
        data = jax.lax.fori_loop(0, nsteps, lambda _, d: mjx.step(mx, d), self._data(branch, phys, ctrl))
        stale = data.sensordata[: scenes.SENSOR_DIM].astype(self.dtype)
        return self._phys_vector(branch, data, phys), self._sensors(mx, data), stale

    def advance(self, phys: jax.Array, ctrl: jax.Array, task: jax.Array, nsteps: jax.Array | int) -> Advance:
        """``nsteps`` MuJoCo steps of every row with its controls held.

        Args:
          phys: (B, S) float32 state vectors; ctrl: (B, C) float32 control vectors (host layouts).
          task: (B,) int task ids (:data:`.tasks.TASKS` order).
          nsteps: () int32 number of ``mjx.step`` calls (traced: one compiled program serves any count; pass a
          non-weak ``jnp.int32`` so eager calls share the jitted :attr:`kernel`'s cache entry).
        Returns: :class:`Advance` (rows of tasks not compiled in are NaN).
        """
        nsteps = jnp.asarray(nsteps, jnp.int32)
        # Rows of tasks not compiled in (NaN state) simulate the first model's rest state instead: NaN never
        # converges, and under vmap the solver's loop would run every row to its iteration cap on every step.
        known = (jnp.asarray(self.branch_of_task)[task] >= 0)[:, None]
        phys = jnp.where(known, phys, jnp.asarray(self._idle_phys, phys.dtype))
        ctrl = jnp.where(known, ctrl, jnp.asarray(self._idle_ctrl, ctrl.dtype))
        def one(row: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
            p, c, t = row
            return self._switch(self._advance_one, t, p, c, nsteps)

        rows = (phys, ctrl, jnp.asarray(task))
        if self.chunk is None or self.chunk >= phys.shape[0]:
            return Advance(*jax.vmap(one)(rows))
        return Advance(*jax.lax.map(one, rows, batch_size=self.chunk))

    # ------------------------------------------------------------------ step
    def step(self, phys: jax.Array, ctrl: jax.Array, action: jax.Array, task: jax.Array, active: jax.Array
             ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One environment step of the ``active`` rows.

        Args:
          phys: (B, S) float32 state vectors; ctrl: (B, C) float32 control vectors (host layouts).
          action: (B, 4) actions; task: (B,) int task ids (:data:`.tasks.TASKS` order); active: (B,) bool.
        Returns: phys' (B, S), ctrl' (B, C), sensors (B, 39); inactive rows unchanged (sensors 0).
        """
        new_ctrl = controls(self, ctrl, action, task, phys)
        out = self.kernel(phys, new_ctrl, task, jnp.int32(FRAME_SKIP))
        keep = active[:, None]
        return (jnp.where(keep, out.phys, phys), jnp.where(keep, new_ctrl, ctrl),
                jnp.where(keep, out.sensors, 0.0))

    # ------------------------------------------------------------------ reset
    def _reset_begin_one(self, branch: int, rand: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Step 1 of the reset of one row: (S,) state and (C,) control vectors before the hand settles."""
        from mujoco import mjx

        spec = TASKS[self.task_ids[branch]]
        data = mjx.make_data(self.mjx_models[branch])
        mocap_pos = data.mocap_pos
        for mocap, pos in zip(self.fixture_mocaps[branch], _fixture_positions(spec, rand)):
            mocap_pos = mocap_pos.at[mocap].set(pos)
        hand = self.hand_mocaps[branch]
        data = data.replace(mocap_pos=mocap_pos.at[hand].set(jnp.asarray(spec.hand_init, self.dtype)),
                            mocap_quat=data.mocap_quat.at[hand].set(jnp.asarray(HAND_QUAT, self.dtype)),
                            ctrl=jnp.array([-1.0, 1.0], self.dtype))
        return (self._phys_vector(branch, data, jnp.zeros(self.state_width, self.dtype)),
                self._ctrl_vector(branch, data))

    def _reset_end_one(self, branch: int, phys: jax.Array, ctrl: jax.Array, rand: jax.Array, stale: jax.Array,
                       stale_end: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Step 3 of the reset of one row: the task's writes and constants on the settled state (S,).

        Returns: the state (S,), constants (CONST_DIM,) and first observation (39,)."""
        from mujoco import mjx

        m, mx, spec = self.models[branch], self._model(branch, ctrl), TASKS[self.task_ids[branch]]
        reset = TASK_RESETS[spec.name]
        data = self._data(branch, phys, ctrl)
        consts = jnp.zeros(CONST_DIM, self.dtype)
        consts = consts.at[6:9].set(0.5 * (stale[_SL["ree"]] + stale[_SL["lee"]]))  # init_tcp
        consts = consts.at[9:12].set(stale[_SL["lpad"]]).at[12:15].set(stale[_SL["rpad"]])
        stale_write = spec.name in ("window-open", "window-close")  # written after the reads, no forward
        if not stale_write:
            qpos, qvel = reset.write(m, data.qpos, data.qvel, rand, stale)
            data = data.replace(qpos=qpos, qvel=qvel)
        kin_data = mjx.kinematics(mx, data)
        kin = Kin(site=lambda name: kin_data.site_xpos[m.site(name).id],
                  body=lambda name: kin_data.xpos[m.body(name).id])
        consts = reset.consts(m, kin, rand, stale, consts)
        if stale_write:
            qpos, qvel = reset.write(m, data.qpos, data.qvel, rand, stale)
            data = data.replace(qpos=qpos, qvel=qvel)
        if spec.name in STALE_RESET_OBSERVATION:
            sensors = stale_end
        else:
            sensors = mjx.sensor_pos(mx, kin_data).sensordata[: scenes.SENSOR_DIM].astype(self.dtype)
        return self._phys_vector(branch, data, phys), consts, sensors

    def reset(self, task: jax.Array, rand: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """Meta-World's reset of each row in JAX (:meth:`.host.MetaWorldHost.reset64`).

        Args:
          task: (B,) int task ids; rand: (B, RAND_DIM) random reset vectors.
        Returns: float32 state (B, S), control (B, C), constants (B, CONST_DIM), sensors (B, 39); rows of
          tasks not compiled in are NaN.
        """
        task = jnp.asarray(task, jnp.int32)
        rand = jnp.asarray(rand, self.dtype)
        if rand.shape != task.shape + (RAND_DIM,):
            raise ValueError(f"rand must be (B, {RAND_DIM}) reset vectors for task (B,) = {task.shape}, got {rand.shape}")
        phys, ctrl = jax.vmap(lambda t, r: self._switch(self._reset_begin_one, t, r))(task, rand)
        settled = self.kernel(phys, ctrl, task, jnp.int32(RESET_STEPS))
        extra = np.array([EXTRA_RESET_STEPS.get(TASKS[k].name, 0) for k in self.task_ids])
        if extra.any():  # door-lock steps on (its warm start restarts at 0 here; the host carries it)
            more = self.kernel(settled.phys, ctrl, task, jnp.asarray(extra)[jnp.maximum(
                jnp.asarray(self.branch_of_task)[task], 0)].max())
            has_extra = (jnp.asarray(extra)[jnp.maximum(jnp.asarray(self.branch_of_task)[task], 0)] > 0)[:, None]
            end_phys = jnp.where(has_extra, more.phys, settled.phys)
            stale_end = jnp.where(has_extra, more.stale, settled.stale)
        else:
            end_phys, stale_end = settled.phys, settled.stale
        return self.reset_finish(task, end_phys, ctrl, rand, settled.stale, stale_end)

    def reset_finish(self, task: jax.Array, phys: jax.Array, ctrl: jax.Array, rand: jax.Array, stale: jax.Array,
                     stale_end: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """The last step of the reset (the task's writes and constants) on settled rows, as
        :meth:`.host.MetaWorldHost.reset64` does after :meth:`~.host.MetaWorldHost.reset_settle64`.

        Args:
          task: (B,) int task ids; phys (B, S) the state at the end of the reset's stepping; ctrl (B, C);
          rand (B, RAND_DIM); stale (B, 39) the sensors MuJoCo left right after the hand's settling;
          stale_end (B, 39) those at the end of the stepping.
        Returns: as :meth:`reset`.
        """
        args = (jnp.asarray(task, jnp.int32),) + tuple(jnp.asarray(x, self.dtype) for x in (phys, ctrl, rand, stale,
                                                                                             stale_end))
        phys, consts, sensors = jax.vmap(lambda t, p, c, r, s, e: self._switch(self._reset_end_one, t, p, c, r, s, e))(
            *args)
        return phys, args[2], consts, sensors


def controls(physics: MjxPhysics, ctrl: jax.Array, action: jax.Array, task: jax.Array, phys: jax.Array
             ) -> jax.Array:
    """Meta-World's control of an action in JAX (:meth:`.host.MetaWorldHost.controls64` in float32).

    Args:
      physics: the column tables of :class:`MjxPhysics`.
      ctrl: (B, C) control vectors; action: (B, 4); task: (B,) task ids; phys: (B, S) states (the latch).
    Returns: (B, C) new control vectors.
    """
    action = jnp.asarray(action, jnp.float32)
    rows = jnp.arange(ctrl.shape[0])[:, None]
    cols = jnp.asarray(physics.hand_pos_cols)[task]                     # (B, 3)
    low, high = jnp.asarray(MOCAP_LOW)[task], jnp.asarray(MOCAP_HIGH)[task]
    delta = jnp.clip(action[:, :3], -1.0, 1.0) * jnp.float32(0.01)
    ctrl = ctrl.at[rows, cols].set(jnp.clip(ctrl[rows, cols] + delta, low, high))
    ctrl = ctrl.at[rows, jnp.asarray(physics.hand_quat_cols)[task]].set(jnp.asarray(HAND_QUAT, ctrl.dtype))
    ctrl = ctrl.at[:, 0].set(action[:, 3]).at[:, 1].set(-action[:, 3])
    latch = jnp.asarray(physics.latch_cols)[task]                         # (B,)
    lock = jnp.take_along_axis(phys, jnp.asarray(physics.latch_qpos)[task][:, None], 1)[:, 0]
    held = (jnp.take_along_axis(ctrl, jnp.maximum(latch, 0)[:, None], 1)[:, 0] > 0) & (
        lock > scenes.LOCK_RELEASE_ANGLE)
    latched = ctrl.at[jnp.arange(ctrl.shape[0]), jnp.maximum(latch, 0)].set(held.astype(ctrl.dtype))
    return jnp.where((latch >= 0)[:, None], latched, ctrl)
