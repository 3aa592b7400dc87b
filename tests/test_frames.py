"""Pictures of episodes: the recorded episodes are the evaluation's, each environment's drawing (its
``render.py``) puts each object where the state says, the grid is written, and MuJoCo renders (or says why
it cannot)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Circle, FancyArrow, Polygon, Rectangle  # noqa: E402

from imaginejax import envs  # noqa: E402
from imaginejax.bench import frames  # noqa: E402
from imaginejax.envs.babyai import grid as G  # noqa: E402
from imaginejax.envs.babyai import render as babyai_render  # noqa: E402
from imaginejax.envs.clevr import physics  # noqa: E402
from imaginejax.envs.clevr import render as clevr_render  # noqa: E402
from imaginejax.training.evaluation import evaluate  # noqa: E402


def random_policy(env):
    if env.discrete:
        return lambda obs, key: jax.random.randint(key, (obs.shape[0],), 0, env.num_actions)
    return lambda obs, key: jax.random.uniform(key, (obs.shape[0], env.action_dim), minval=-1.0, maxval=1.0)


@pytest.fixture(scope="module")
def babyai():
    """Six random-policy episodes of BabyAI's hard level (K = 3 tasks): (env, params, policy, key, episodes)."""
    env, params = envs.make("babyai", "hard")
    policy, key = random_policy(env), jax.random.PRNGKey(4)
    return env, params, policy, key, frames.record(policy, env, params, key, 6)


def test_recorded_episodes_are_those_of_the_evaluation(babyai):
    env, params, policy, key, episodes = babyai
    result = jax.jit(lambda k: evaluate(policy, env, params, k, 6))(key)
    assert episodes.states.t.shape == (params.max_steps + 1, 6)
    np.testing.assert_array_equal(episodes.tasks, np.arange(6) % 3)
    per_task = np.bincount(episodes.tasks, weights=episodes.success, minlength=3) / 2
    np.testing.assert_allclose(per_task, np.asarray(result.task_success), atol=1e-6)
    assert episodes.lengths.mean() == pytest.approx(float(result.mean_length))
    # Each kept state follows from the one before by the environment's step with the recorded action.
    t = 5
    before = jax.tree.map(lambda leaf: leaf[t], episodes.states)
    _, after, *_ = env.step_batch(jax.random.split(key, 6), before, episodes.actions[t], params)
    np.testing.assert_array_equal(np.asarray(env.state_vector(after)),
                                  np.asarray(env.state_vector(episodes.states))[t + 1])
    strings = env.instructions("hard")
    assert all(text in strings for text in episodes.instructions)


def test_frame_steps_spread_over_the_episode():
    np.testing.assert_array_equal(frames.frame_steps(50, 6), [0, 10, 20, 30, 40, 50])
    np.testing.assert_array_equal(frames.frame_steps(3, 6), [0, 1, 2, 3])  # no step twice
    np.testing.assert_array_equal(frames.frame_steps(0, 6), [0])


def test_clevr_balls_are_drawn_where_the_state_puts_them():
    state = np.array([[0.1, 0.2], [-0.3, 0.0], [0.4, 0.4], [0.0, -0.2], [-0.4, 0.3]], np.float32)
    fig, ax = plt.subplots()
    clevr_render.draw(ax, state.reshape(10), action=2 * 8 + 1)  # push ball 2 (green) in direction 1: +y
    discs = [p for p in ax.patches if isinstance(p, Circle)]
    np.testing.assert_allclose([d.center for d in discs], state, atol=1e-6)
    assert [matplotlib.colors.to_hex(d.get_facecolor()) for d in discs] == [
        matplotlib.colors.to_hex(c) for c in physics.COLOURS]
    assert all(d.radius == physics.BALL_RADIUS for d in discs)
    arrow = next(p for p in ax.patches if isinstance(p, FancyArrow))
    outline = arrow.get_xy()  # from the green ball's centre (0.4, 0.4), 0.2 along +y
    np.testing.assert_allclose([outline[:, 1].min(), outline[:, 1].max()], [0.4, 0.6], atol=1e-6)
    assert np.abs(outline[:, 0] - 0.4).max() < 0.05
    plt.close(fig)
    limits = clevr_render.limits(state.reshape(10), margin=0.25)
    np.testing.assert_allclose(limits, [[-0.65, -0.55], [0.65, 0.75]], atol=1e-6)  # square around all balls


def test_babyai_room_is_drawn_from_the_state_vector():
    # Blue box at (2, 3), red ball carried by the agent at (4, 5), green key at (6, 1), purple locked door at y 2.
    grid = G.make_grid(ball=(G.RED, 0, 0), box=(G.BLUE, 2, 3), key=(G.GREEN, 6, 1), door=(G.PURPLE, 2, G.LOCKED),
                       agent=(4, 5), carried=(G.BALL, G.RED))
    state = np.asarray(G.to_vector(grid))
    fig, ax = plt.subplots()
    babyai_render.draw(ax, state)
    hexes = lambda p: matplotlib.colors.to_hex(p)
    cells = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() == 1]
    walls = [p for p in cells if hexes(p.get_facecolor()) != "#ffffff"]
    assert len(cells) == 64 and len(walls) == 64 - 36
    door = next(p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() == pytest.approx(0.8))
    assert door.get_xy() == pytest.approx((7.1, 2.1)) and hexes(door.get_facecolor()) == babyai_render.PALETTE["purple"]
    assert len(ax.lines) == 2  # the locked door's cross
    box = next(p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() == pytest.approx(0.6))
    assert box.get_xy() == pytest.approx((2.2, 3.2)) and hexes(box.get_edgecolor()) == babyai_render.PALETTE["blue"]
    polygons = [p for p in ax.patches if isinstance(p, Polygon)]
    key = next(p for p in polygons if hexes(p.get_facecolor()) == babyai_render.PALETTE["green"])
    assert key.get_xy()[:4].mean(0) == pytest.approx((6.5, 1.5))
    agent = next(p for p in polygons if hexes(p.get_facecolor()) == "#000000")
    assert agent.get_xy()[:3].mean(0) == pytest.approx((4.5, 5.5 + 0.1), abs=1e-6)
    carried = next(p for p in ax.patches if isinstance(p, Circle))  # the ball, small, in the agent's cell
    assert carried.center == pytest.approx((4.5, 5.6)) and carried.radius < 0.2
    assert hexes(carried.get_facecolor()) == babyai_render.PALETTE["red"]
    plt.close(fig)


def test_grid_is_written(babyai, tmp_path):
    env, params, _, _, episodes = babyai
    written = frames.write_frames(env, params, episodes, tmp_path, columns=4)
    assert written == [tmp_path / "frames.png"]
    image = plt.imread(written[0])
    columns = max(len(frames.frame_steps(int(length), 4)) for length in episodes.lengths)  # 1.9 x 2.2 in per panel
    assert image.shape[:2] == (int(2.2 * 6 * 80), int(1.9 * columns * 80)) and image.std() > 0.05
    other = type("GridWorld", (), {"name": "gridworld"})()
    with pytest.raises(ValueError, match="no frames for environment 'gridworld'; environments with frames: "
                                         "babyai, cheetah, clevr, libero, metaworld"):
        frames.write_frames(other, params, episodes, tmp_path)


def test_no_opengl_is_reported_with_the_fix(monkeypatch):
    import mujoco

    def fail(*args, **kwargs):
        raise mujoco.FatalError("an OpenGL platform library has not been loaded into this process")

    monkeypatch.setattr(mujoco, "Renderer", fail)
    with pytest.raises(frames.RenderingUnavailable, match=r"cannot render offscreen here .*start Python with "
                                                          r"MUJOCO_GL=egl, or MUJOCO_GL=osmesa"):
        frames.renderer(None, 24, 32)


CHEETAH = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from imaginejax import envs
    from imaginejax.bench import frames
    env, params = envs.make("cheetah", "easy")
    _, first = env.reset_to_task_batch(jax.random.split(jax.random.PRNGKey(0), 1), params, np.array([0]))
    step = jax.jit(lambda s: env.step_batch(jax.random.split(jax.random.PRNGKey(1), 1), s, np.zeros((1, 6)), params)[1])
    later = first
    for _ in range(10):
        later = step(later)
    scene = envs.renderer("cheetah").scene(env, params, 0)
    row = lambda state: jax.tree.map(lambda leaf: np.asarray(leaf)[0], state)
    try:
        images = frames.render(scene, [row(first), row(later)], (48, 64))
    except frames.RenderingUnavailable as error:
        print(json.dumps({"unavailable": str(error)}))
        sys.exit(0)
    gif = frames.write_gif(__import__("pathlib").Path(sys.argv[1]) / "e.gif", images, 0.05)
    from PIL import Image
    print(json.dumps({"shape": list(images.shape), "std": float(images.std()),
                      "change": float(np.abs(images[0].astype(float) - images[1]).mean()),
                      "gif_frames": Image.open(gif).n_frames}))
""")


def test_cheetah_frames_render_through_mujoco(tmp_path):
    """MuJoCo chooses its OpenGL backend at import, so the render runs in a fresh interpreter with
    MUJOCO_GL=egl (what imaginejax evaluate --frames sets); where no OpenGL works the test is skipped
    with the renderer's own message."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run([sys.executable, "-c", CHEETAH, str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    if "unavailable" in out:
        pytest.skip(out["unavailable"])
    assert out["shape"] == [2, 48, 64, 3] and out["std"] > 5 and out["gif_frames"] == 2
    assert out["change"] > 1  # the zero-action cheetah settles under gravity from its noisy reset pose


SCENES = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from imaginejax import envs
    from imaginejax.bench import frames
    out = {}
    for name in ("metaworld", "libero"):
        env, params = envs.make(name, "train")
        tasks = np.array([0, 5])  # Meta-World: reach, then door-open (a scene with a large fixture)
        _, states = env.reset_to_task_batch(jax.random.split(jax.random.PRNGKey(0), 2), params, tasks)
        try:
            images = [frames.render(envs.renderer(name).scene(env, params, int(k)),
                                    [jax.tree.map(lambda leaf: np.asarray(leaf)[row], states)], (60, 80))[0]
                      for row, k in enumerate(tasks)]
        except frames.RenderingUnavailable as error:
            print(json.dumps({"unavailable": str(error)}))
            sys.exit(0)
        out[name] = {"std": float(images[0].std()),
                     "change": float(np.abs(images[0].astype(float) - images[1]).mean())}
        if name == "metaworld":  # the MJX backend's layout: the same vectors as float32
            from imaginejax.envs.mujoco_host import unpack64
            row = jax.tree.map(lambda leaf: np.asarray(leaf)[0], states)
            row = row.replace(phys=unpack64(row.phys).astype(np.float32), ctrl=unpack64(row.ctrl).astype(np.float32))
            single = frames.render(envs.renderer(name).scene(env, params, 0), [row], (60, 80))[0]
            out[name]["float32"] = float(np.abs(single.astype(float) - images[0]).mean())
    print(json.dumps(out))
""")


def test_metaworld_and_libero_scenes_render_their_reset_states(tmp_path):
    """Each task's scene with its reset state (Meta-World: another scene per task; LIBERO: one scene,
    other objects placed), rendered in a fresh interpreter with MUJOCO_GL=egl."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run([sys.executable, "-c", SCENES], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    if "unavailable" in out:
        pytest.skip(out["unavailable"])
    for name in ("metaworld", "libero"):
        assert out[name]["std"] > 5 and out[name]["change"] > 0.5, (name, out[name])
    assert out["metaworld"]["float32"] < 0.05  # rounding the state to float32 moves no visible pixel
