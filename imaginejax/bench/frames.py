"""Pictures of a policy's episodes, drawn from the environment's own states.

    episodes = record(policy.policy_fn(), env, params, jax.random.PRNGKey(0), 4)   # every state kept
    paths = write_frames(env, params, episodes, "out/")                             # out/frames.png

``frames.png`` is a grid: one row per episode (its instruction and outcome above it), columns spread
evenly over the episode from the reset state to its last step. How a state looks is the environment's
:class:`~imaginejax.envs.registry.Renderer` (``envs/<name>/render.py``, through :func:`imaginejax.envs.renderer`):
drawn with matplotlib from the state vector, or a MuJoCo scene rendered offscreen from the physics state,
in which case each episode is also written as ``episode-<i>.gif`` at real-time speed. MuJoCo's renderer
needs OpenGL: on a machine without a display, start Python with ``MUJOCO_GL=egl`` (or ``osmesa``); without
a working context :class:`RenderingUnavailable` says so.
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

from imaginejax import envs
from imaginejax.envs.registry import Scene

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
# Rendered by MuJoCo
# ---------------------------------------------------------------------------------------------------
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
      ValueError: no renderer for the environment (``env.name``).
      RenderingUnavailable: a MuJoCo environment, and no OpenGL context.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_renderer = envs.renderer(env.name)
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
        images = view = None
        if env_renderer.scene is not None:
            scene = env_renderer.scene(env, params, int(episodes.tasks[i]))
            if video:
                stride = -(-(length + 1) // VIDEO_FRAMES)
                video_steps = list(range(0, length + 1, stride))
                frames = render(scene, [episodes.state(t, i) for t in video_steps])
                written.append(write_gif(out / f"episode-{i}.gif", frames, stride * scene.seconds_per_step))
            images = render(scene, [episodes.state(int(t), i) for t in steps[i]])
        elif env_renderer.view is not None:
            view = env_renderer.view(vectors[: length + 1, i])
        for j, ax in enumerate(axes[i]):
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(steps[i]):
                ax.axis("off")
                continue
            t = int(steps[i][j])
            if images is not None:
                ax.imshow(images[j])
            else:
                env_renderer.draw(ax, vectors[t, i], episodes.actions[t, i] if t < length else None, view)
            ax.set_xlabel(f"t = {t}", fontsize=8)
        outcome = "success" if episodes.success[i] else "failure"
        title = textwrap.shorten(f"{i}: {episodes.instructions[i]}", 110) + f"  —  {outcome} after {length} steps"
        # Outside the layout: a long instruction may run over the row's other panels, never shrink them.
        axes[i][0].text(0, 1.06, title, transform=axes[i][0].transAxes, fontsize=9, va="bottom").set_in_layout(False)
    fig.suptitle(f"{env.name}/{params.level}: {count} episode{'s' * (count != 1)}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.subplots_adjust(hspace=0.45)  # room for each row's title, kept out of the layout above
    fig.savefig(out / "frames.png", dpi=80)
    plt.close(fig)
    return [out / "frames.png", *written]
