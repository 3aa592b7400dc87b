"""Pictures of a policy's episodes, drawn from the environment's own states.

    episodes = record(policy.policy_fn(), env, params, jax.random.PRNGKey(0), 4)   # every state kept
    paths = write_frames(env, params, episodes, "out/")                             # out/frames.png

``frames.png`` is a grid: one row per episode (its instruction and outcome above it), columns spread
evenly over the episode from the reset state to its last step. CLEVR-Robot and BabyAI are drawn with
matplotlib from their state vectors: CLEVR's five balls on the table plane in their colours, with the
push about to happen as an arrow; BabyAI's 8 × 8 room (walls, the door in its colour and state, ball,
box and key, the agent, what it carries). HalfCheetah, Meta-World and LIBERO are rendered by MuJoCo's
offscreen renderer from the physics state (``mj_setState`` of the float64 state, then ``mj_forward``),
and each episode is also written as ``episode-<i>.gif`` at real-time speed. The renderer needs OpenGL:
on a machine without a display, start Python with ``MUJOCO_GL=egl`` (or ``osmesa``); without a working
context :class:`RenderingUnavailable` says so.
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

PolicyFn = Callable[[jax.Array, jax.Array], jax.Array]  # (obs (B, S+E), key) -> actions (B, ...)
COLUMNS = 6
VIDEO_FRAMES = 60  # at most this many frames per episode video (every k-th step beyond)
FRAME_SIZE = (240, 320)  # (height, width) of a MuJoCo frame


class RenderingUnavailable(RuntimeError):
    """MuJoCo cannot render offscreen in this process (no OpenGL context)."""


@dataclasses.dataclass(frozen=True)
class Episodes:
    """B recorded episodes of one level (host arrays).

    Attributes:
      states: the environment's state pytree with leaves (T+1, B, ...): the reset state, then each step's.
      actions: (T, B, ...) the actions taken.
      tasks: (B,) task rows; episode i runs task ``i mod K``.
      lengths: (B,) steps until the episode ended (success or the step cap).
      success: (B,) whether it ended in success.
      instructions: B instruction strings.
    """

    states: Any
    actions: np.ndarray
    tasks: np.ndarray
    lengths: np.ndarray
    success: np.ndarray
    instructions: tuple[str, ...]

    def state(self, step: int, episode: int) -> Any:
        """The state of ``episode`` after ``step`` steps (a pytree without the batch axis)."""
        return jax.tree.map(lambda leaf: leaf[step, episode], self.states)


def record(policy: PolicyFn, env: Any, params: Any, key: jax.Array, num_episodes: int) -> Episodes:
    """Runs ``num_episodes`` episodes (episode i: task ``i mod K``) for the level's step cap, keeping every
    state. Keys are split as :func:`imaginejax.training.evaluation.evaluate` splits them, so with B = E·K episodes
    the outcomes are those of the evaluation of training."""
    tasks = jnp.arange(num_episodes, dtype=jnp.int32) % params.num_tasks

    @jax.jit
    def run(key: jax.Array) -> tuple[Any, Any, jax.Array]:
        reset_key, run_key = jax.random.split(key)
        obs, state = env.reset_to_task_batch(jax.random.split(reset_key, num_episodes), params, tasks)

        def body(carry, step_key):
            obs, state = carry
            act_key, env_key = jax.random.split(step_key)
            action = policy(obs, act_key)
            obs, state, *_ = env.step_batch(jax.random.split(env_key, num_episodes), state, action, params)
            return (obs, state), (state, action)

        _, (states, actions) = jax.lax.scan(body, (obs, state), jax.random.split(run_key, params.max_steps))
        return state, states, actions

    first, later, actions = jax.device_get(run(key))
    states = jax.tree.map(lambda a, b: np.concatenate([np.asarray(a)[None], np.asarray(b)]), first, later)
    strings = env.instructions(params.level)
    return Episodes(states=states, actions=np.asarray(actions), tasks=np.asarray(tasks),
                    lengths=np.asarray(states.t[-1]), success=np.asarray(states.success[-1]),
                    instructions=tuple(strings[int(m)] for m in states.instruction[0]))


def frame_steps(length: int, count: int) -> np.ndarray:
    """At most ``count`` steps spread evenly over 0..length, both ends included."""
    return np.unique(np.round(np.linspace(0, length, max(count, 2))).astype(int))


# ---------------------------------------------------------------------------------------------------
# Drawn from the state vector
# ---------------------------------------------------------------------------------------------------
def draw_clevr(ax: Any, state: np.ndarray, action: int | None = None, limits: np.ndarray | None = None) -> None:
    """CLEVR-Robot from above: state (10,) = five ball centres (x, y) in colour order, drawn as discs of the
    ball radius; ``action`` (ball · 8 + direction) as an arrow from the ball it pushes; ``limits`` (2, 2)
    the view's [[x0, y0], [x1, y1]]."""
    from matplotlib.patches import Circle

    from imaginejax.envs.clevr import physics

    balls = np.asarray(state, np.float64).reshape(physics.N_BALLS, 2)
    ax.set_facecolor("0.86")
    for xy, colour in zip(balls, physics.COLOURS):
        ax.add_patch(Circle(xy, physics.BALL_RADIUS, facecolor=colour, edgecolor="black", linewidth=0.6))
    if action is not None:
        ball, direction = divmod(int(action), 8)
        push = physics.DIRECTIONS[direction] / np.linalg.norm(physics.DIRECTIONS[direction]) * 0.2
        ax.arrow(*balls[ball], *push, width=0.012, color="black", length_includes_head=True)
    if limits is None:
        limits = np.stack([balls.min(0), balls.max(0)])
    ax.set_xlim(limits[0, 0], limits[1, 0])
    ax.set_ylim(limits[0, 1], limits[1, 1])
    ax.set_aspect("equal")


def clevr_limits(states: np.ndarray, margin: float = 0.25) -> np.ndarray:
    """(2, 2) square view [[x0, y0], [x1, y1]] holding every ball of states (..., 10) with ``margin`` around."""
    balls = np.asarray(states, np.float64).reshape(-1, 2)
    centre, half = (balls.min(0) + balls.max(0)) / 2, (balls.max(0) - balls.min(0)).max() / 2 + margin
    return np.stack([centre - half, centre + half])


BABYAI_COLOURS = {"red": "#e6194b", "green": "#3cb44b", "blue": "#4363d8", "purple": "#911eb4",
                  "yellow": "#ffe119", "grey": "#808080"}


def draw_babyai(ax: Any, state: np.ndarray) -> None:
    """BabyAI's room in minigrid's coordinates (x east, y south): state (17,) (:mod:`~imaginejax.envs.babyai.grid`
    layout). Walls dark, the door on the east wall in its colour (open: an outline, closed: filled, locked:
    filled and crossed), ball (disc), box (open square) and key (diamond) in their colours, the agent a black
    triangle holding a small copy of what it carries."""
    from matplotlib.patches import Circle, Polygon, Rectangle

    from imaginejax.envs.babyai import grid as G

    s = np.rint(np.asarray(state)).astype(int)
    colour = lambda index: BABYAI_COLOURS[G.COLOURS[index]]

    def shape(kind: int, x: float, y: float, size: float, fill: str) -> Any:
        if kind == G.BALL:
            return Circle((x, y), 0.32 * size, facecolor=fill, edgecolor="black", linewidth=0.5)
        if kind == G.BOX:
            return Rectangle((x - 0.3 * size, y - 0.3 * size), 0.6 * size, 0.6 * size, facecolor="none",
                             edgecolor=fill, linewidth=2.5 * size)
        return Polygon([(x, y - 0.35 * size), (x + 0.25 * size, y), (x, y + 0.35 * size), (x - 0.25 * size, y)],
                       facecolor=fill, edgecolor="black", linewidth=0.5)

    ax.set_facecolor("white")
    for x in range(G.GRID_SIZE):
        for y in range(G.GRID_SIZE):
            inside = G.ROOM_MIN <= x <= G.ROOM_MAX and G.ROOM_MIN <= y <= G.ROOM_MAX
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor="white" if inside else "0.35", edgecolor="0.75",
                                   linewidth=0.3))
    door_y, door_state, door_colour = s[G.DOOR_Y], s[G.DOOR_STATE], colour(s[G.DOOR_COLOUR])
    ax.add_patch(Rectangle((G.DOOR_X + 0.1, door_y + 0.1), 0.8, 0.8, linewidth=1.5, edgecolor=door_colour,
                           facecolor="white" if door_state == G.OPEN else door_colour))
    if door_state == G.LOCKED:
        for ends in ((0.25, 0.75), (0.75, 0.25)):
            ax.plot([G.DOOR_X + 0.25, G.DOOR_X + 0.75], [door_y + ends[0], door_y + ends[1]], color="black",
                    linewidth=1.0)
    for slot, kind in enumerate(G.OBJECTS):
        if s[G.CARRIED_TYPE] != kind:
            x, y = s[G.BALL_X + 3 * slot] + 0.5, s[G.BALL_Y + 3 * slot] + 0.5
            ax.add_patch(shape(kind, x, y, 1.0, colour(s[G.BALL_COLOUR + 3 * slot])))
    x, y = s[G.AGENT_X] + 0.5, s[G.AGENT_Y] + 0.5
    ax.add_patch(Polygon([(x, y - 0.38), (x + 0.36, y + 0.34), (x - 0.36, y + 0.34)], facecolor="black"))
    if s[G.CARRIED_TYPE] != G.NOTHING:
        ax.add_patch(shape(s[G.CARRIED_TYPE], x, y + 0.1, 0.5, colour(s[G.CARRIED_COLOUR])))
    ax.set_xlim(0, G.GRID_SIZE)
    ax.set_ylim(G.GRID_SIZE, 0)  # y grows to the south
    ax.set_aspect("equal")


# ---------------------------------------------------------------------------------------------------
# Rendered by MuJoCo
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Scene:
    """What MuJoCo renders for one task: the model, how a state is written into its data, the camera
    (``lookat``, distance, azimuth, elevation; ``track`` names a body the camera follows instead)."""

    model: Any
    load: Callable[[Any, Any], None]
    lookat: tuple[float, float, float] = (0.0, 0.0, 0.0)
    distance: float = 2.0
    azimuth: float = 90.0
    elevation: float = -25.0
    track: str | None = None
    seconds_per_step: float = 0.05


def cheetah_scene(env: Any, params: Any, task: int) -> Scene:
    """HalfCheetah: qpos/qvel (hi + lo) of ``state.physics``; the camera follows the torso from the side."""
    from imaginejax.envs.cheetah import model as cheetah_model

    def load(data: Any, state: Any) -> None:
        physics = state.physics
        data.qpos[:] = np.asarray(physics.qpos, np.float64) + np.asarray(physics.qpos_lo, np.float64)
        data.qvel[:] = np.asarray(physics.qvel, np.float64) + np.asarray(physics.qvel_lo, np.float64)

    model = cheetah_model.load_model()
    return Scene(model, load, distance=4.0, azimuth=90.0, elevation=-15.0, track="torso",
                 seconds_per_step=float(model.opt.timestep) * cheetah_model.FRAME_SKIP)


def metaworld_scene(env: Any, params: Any, task: int) -> Scene:
    """Meta-World: the task's scene with the FULLPHYSICS state and the control vector (the hand's mocap
    target) of the state (float64 bit patterns, or MJX's float32 vectors)."""
    import mujoco

    from imaginejax.envs.metaworld.host import CONTROL_SPEC, FRAME_SKIP
    from imaginejax.envs.mujoco_host import FULLPHYSICS, unpack64

    model = env.host.models[int(np.asarray(params.goals)[task, 0])]
    sizes = mujoco.mj_stateSize(model, FULLPHYSICS), mujoco.mj_stateSize(model, CONTROL_SPEC)
    as64 = lambda x: unpack64(x) if np.asarray(x).dtype == np.uint32 else np.asarray(x, np.float64)

    def load(data: Any, state: Any) -> None:
        mujoco.mj_setState(model, data, as64(state.phys)[: sizes[0]], FULLPHYSICS)
        mujoco.mj_setState(model, data, as64(state.ctrl)[: sizes[1]], CONTROL_SPEC)

    return Scene(model, load, lookat=(0.0, 0.7, 0.1), distance=1.25, azimuth=135.0, elevation=-30.0,
                 seconds_per_step=float(model.opt.timestep) * FRAME_SKIP)


def libero_scene(env: Any, params: Any, task: int) -> Scene:
    """LIBERO: the scene with the FULLPHYSICS state ``hi + lo``."""
    import mujoco

    from imaginejax.envs.libero import model as libero_model
    from imaginejax.envs.mujoco_host import FULLPHYSICS, join64

    model = libero_model.load_model()

    def load(data: Any, state: Any) -> None:
        mujoco.mj_setState(model, data, join64(state.hi, state.lo), FULLPHYSICS)

    return Scene(model, load, lookat=(0.4, 0.0, 0.3), distance=1.7, azimuth=180.0, elevation=-30.0,
                 seconds_per_step=float(model.opt.timestep) * libero_model.FRAME_SKIP)


SCENES: dict[str, Callable[[Any, Any, int], Scene]] = {
    "cheetah": cheetah_scene, "metaworld": metaworld_scene, "libero": libero_scene}


def renderer(model: Any, height: int, width: int) -> Any:
    """``mujoco.Renderer`` of ``model``, or :class:`RenderingUnavailable` naming the fix."""
    import mujoco

    try:
        return mujoco.Renderer(model, height, width)
    except Exception as error:  # each GL backend fails with its own exception type
        chosen = os.environ.get("MUJOCO_GL", "")
        raise RenderingUnavailable(
            f"MuJoCo cannot render offscreen here (MUJOCO_GL={chosen!r}: {type(error).__name__}: {error}); on a "
            "machine without a display start Python with MUJOCO_GL=egl, or MUJOCO_GL=osmesa where EGL is missing "
            "(MuJoCo reads it once, when it is first imported)") from None


def render(scene: Scene, states: list[Any], size: tuple[int, int] = FRAME_SIZE) -> np.ndarray:
    """(F, H, W, 3) uint8 frames of ``states`` (pytrees without a batch axis) in ``scene``."""
    import mujoco

    data = mujoco.MjData(scene.model)
    camera = mujoco.MjvCamera()
    mujoco.mjv_defaultFreeCamera(scene.model, camera)
    camera.lookat[:] = scene.lookat
    camera.distance, camera.azimuth, camera.elevation = scene.distance, scene.azimuth, scene.elevation
    if scene.track is not None:
        camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        camera.trackbodyid = scene.model.body(scene.track).id
    frames = []
    with renderer(scene.model, *size) as painter:
        for state in states:
            scene.load(data, state)
            mujoco.mj_forward(scene.model, data)
            painter.update_scene(data, camera)
            frames.append(painter.render().copy())
    return np.stack(frames)


def write_gif(path: Path, frames: np.ndarray, seconds_per_frame: float) -> Path:
    """An endlessly looping GIF of (F, H, W, 3) uint8 frames."""
    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(path, save_all=True, append_images=images[1:], loop=0,
                   duration=max(20, int(round(1000 * seconds_per_frame))))
    return path


# ---------------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------------
def write_frames(env: Any, params: Any, episodes: Episodes, out: str | os.PathLike[str], columns: int = COLUMNS,
                 video: bool = True) -> list[Path]:
    """``out/frames.png`` (the grid) and, for the MuJoCo environments when ``video``, ``out/episode-<i>.gif``.

    Raises:
      ValueError: no drawing for the environment (``env.name``).
      RenderingUnavailable: a MuJoCo environment, and no OpenGL context.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_name, drawn = env.name, {"clevr", "babyai"}
    if env_name not in drawn | set(SCENES):
        raise ValueError(f"no frames for environment {env_name!r}; environments with frames: "
                         f"{', '.join(sorted(drawn | set(SCENES)))}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    vectors = np.asarray(env.state_vector(episodes.states))  # (T+1, B, S)
    count = len(episodes.lengths)
    steps = [frame_steps(int(length), columns) for length in episodes.lengths]
    width = max(len(s) for s in steps)
    fig, axes = plt.subplots(count, width, figsize=(1.9 * width, 2.2 * count), squeeze=False)
    for i in range(count):
        length = int(episodes.lengths[i])
        images = None
        if env_name in SCENES:
            scene = SCENES[env_name](env, params, int(episodes.tasks[i]))
            if video:
                stride = -(-(length + 1) // VIDEO_FRAMES)
                video_steps = list(range(0, length + 1, stride))
                frames = render(scene, [episodes.state(t, i) for t in video_steps])
                written.append(write_gif(out / f"episode-{i}.gif", frames, stride * scene.seconds_per_step))
            images = render(scene, [episodes.state(int(t), i) for t in steps[i]])
        limits = clevr_limits(vectors[: length + 1, i]) if env_name == "clevr" else None
        for j, ax in enumerate(axes[i]):
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(steps[i]):
                ax.axis("off")
                continue
            t = int(steps[i][j])
            if images is not None:
                ax.imshow(images[j])
            elif env_name == "clevr":
                action = int(episodes.actions[t, i]) if t < length else None
                draw_clevr(ax, vectors[t, i], action, limits)
            else:
                draw_babyai(ax, vectors[t, i])
            ax.set_xlabel(f"t = {t}", fontsize=8)
        outcome = "success" if episodes.success[i] else "failure"
        title = textwrap.shorten(f"{i}: {episodes.instructions[i]}", 110) + f"  —  {outcome} after {length} steps"
        # Outside the layout: a long instruction may run over the row's other panels, never shrink them.
        axes[i][0].text(0, 1.06, title, transform=axes[i][0].transAxes, fontsize=9, va="bottom").set_in_layout(False)
    fig.suptitle(f"{env_name}/{params.level}: {count} episode{'s' * (count != 1)}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.subplots_adjust(hspace=0.45)  # room for each row's title, kept out of the layout above
    fig.savefig(out / "frames.png", dpi=80)
    plt.close(fig)
    return [out / "frames.png", *written]
