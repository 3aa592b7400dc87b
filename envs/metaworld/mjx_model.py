"""MJX-friendly Meta-World models: the substitutions that make ``mjx.put_model`` accept every scene.

``mujoco-mjx`` has no cylinder–box or cylinder–mesh collision and no margin for pairs with a mesh, and
checks every candidate pair each step. :func:`mjx_friendly` therefore (1) turns colliding cylinders into
:data:`CYLINDER_SIDES`-gon prisms, (2) keeps each changed body's compiled inertia, (3) sets margins and
gaps to 0, (4) filters contacts by body class (:func:`body_classes`): active × all, jointed × jointed,
jointed × static; not the floor, not jointed × table. State and control layouts stay the original's.
Why these, and their measured effect: docs/metaworld_mjx.md.
"""

from __future__ import annotations

import dataclasses
from typing import Final

import mujoco
import numpy as np

__all__ = ["CYLINDER_SIDES", "Substitutions", "body_classes", "candidate_pairs", "mjx_friendly"]

CYLINDER_SIDES: Final[int] = 16


@dataclasses.dataclass(frozen=True)
class Substitutions:
    """What :func:`mjx_friendly` changed in one model (geom names, or ``"#id"`` for unnamed geoms).

    Attributes:
      cylinders: cylinders replaced by prisms.
      margins: geoms whose margin or gap was set to 0.
      filtered: geoms with candidate pairs that stopped colliding altogether (the floor).
      inertia_kept: bodies given their original inertia explicitly.
    """

    cylinders: tuple[str, ...]
    margins: tuple[str, ...]
    filtered: tuple[str, ...]
    inertia_kept: tuple[str, ...]


def _collides(geom: mujoco.MjsGeom) -> bool:
    return bool(geom.contype or geom.conaffinity)


def _prism_vertices(radius: float, half_height: float, sides: int) -> np.ndarray:
    """(2·sides, 3) vertices of a regular prism around the z axis, centred at the origin."""
    angle = 2.0 * np.pi * (np.arange(sides) + 0.5) / sides
    ring = np.stack([radius * np.cos(angle), radius * np.sin(angle)], -1)
    bottom = np.concatenate([ring, np.full((sides, 1), -half_height)], -1)
    top = np.concatenate([ring, np.full((sides, 1), half_height)], -1)
    return np.concatenate([bottom, top], 0)


def _geom_label(geom: mujoco.MjsGeom, index: int) -> str:
    return geom.name or f"#{index}"


def mjx_friendly(spec: mujoco.MjSpec, *, sides: int = CYLINDER_SIDES) -> tuple[mujoco.MjModel, Substitutions]:
    """Compiles an MJX-friendly copy of ``spec`` (``spec`` itself is not changed).

    Args:
      spec: a Meta-World scene spec (as :func:`.scenes.build_model` prepares it: fixtures, sensors).
      sides: polygon sides of the prisms that replace cylinders (>= 6).
    Returns:
      The compiled model and the :class:`Substitutions` made. Mocap welds still need
      :func:`.scenes.reset_mocap_welds`, as for the original model.
    Raises:
      ValueError: ``sides`` < 6, or a scene feature the transform does not know (a cylinder ``fromto``, a
        cylinder in an unnamed body).
    """
    if sides < 6:
        raise ValueError(f"sides must be >= 6 for a prism close to a cylinder, got {sides}")
    original = spec.compile()
    classes = body_classes(original)
    has_pair = np.zeros(original.ngeom, bool)
    for g1, g2 in _pair_set(original):
        has_pair[[g1, g2]] = True
    spec = spec.copy()
    geoms = spec.geoms
    cylinders, margins, filtered, bodies = [], [], [], {}
    for i, geom in enumerate(geoms):
        if not _collides(geom):
            continue
        label = _geom_label(geom, i)
        plane = geom.type == mujoco.mjtGeom.mjGEOM_PLANE
        bits = _BITS[classes[original.geom_bodyid[i]]] if has_pair[i] and not plane else (0, 0)
        if bits == (0, 0):  # the floor; or a geom with no candidate pair at all (the arm's wrist link)
            geom.contype, geom.conaffinity = 0, 0
            if has_pair[i]:
                filtered.append(label)
            continue
        geom.contype, geom.conaffinity = bits
        if geom.margin != 0.0 or geom.gap != 0.0:
            geom.margin = 0.0
            geom.gap = 0.0
            margins.append(label)
        if geom.type == mujoco.mjtGeom.mjGEOM_CYLINDER:
            if not np.isnan(geom.fromto[0]):
                raise ValueError(f"cylinder {label} uses fromto; the transform expects pos/quat/size")
            radius, half = float(geom.size[0]), float(geom.size[1])
            mesh = spec.add_mesh()
            mesh.name = f"ij_prism_{i}"
            mesh.uservert = _prism_vertices(radius, half, sides).reshape(-1).tolist()
            geom.type = mujoco.mjtGeom.mjGEOM_MESH
            geom.meshname = mesh.name
            cylinders.append(label)
            if geom.name:  # the compiler turns a mesh geom's frame to the mesh's principal axes: sensors
                _retarget_geom_sensors(spec, geom)  # of the cylinder's frame read a site at its old frame
            if not geom.parent.name:
                raise ValueError(f"cylinder {label} is in an unnamed body; the transform keeps inertia by body name")
            bodies[geom.parent.name] = geom.parent
    for name, body in bodies.items():
        b = original.body(name)
        body.explicitinertial = True
        body.mass = float(b.mass[0])
        body.ipos = b.ipos.tolist()
        body.iquat = b.iquat.tolist()
        body.inertia = b.inertia.tolist()
    model = spec.compile()
    _check_same_structure(original, model)
    _check_pairs(original, model, classes)
    return model, Substitutions(tuple(cylinders), tuple(margins), tuple(filtered), tuple(bodies))


# Class of a body for the contact filter, and the (contype, conaffinity) bits of its geoms: a pair is
# checked iff (contype1 & conaffinity2) | (contype2 & conaffinity1) != 0 (module docstring, (4)).
ACTIVE, JOINTED, STATIC, TABLE = "active", "jointed", "static", "table"
TABLE_BODIES: Final[frozenset[str]] = frozenset({"world", "tablelink", "RetainingWall"})
_BITS: Final[dict[str, tuple[int, int]]] = {ACTIVE: (1, 1 | 2 | 4 | 8), JOINTED: (2, 1 | 2 | 4), STATIC: (0, 1 | 2),
                                             TABLE: (0, 1)}
_KEPT: Final[frozenset[frozenset[str]]] = frozenset(
    {frozenset(p) for p in ((ACTIVE, ACTIVE), (ACTIVE, JOINTED), (ACTIVE, STATIC), (ACTIVE, TABLE),
                            (JOINTED, JOINTED), (JOINTED, STATIC))})


def body_classes(model: mujoco.MjModel, gripper: str = "right_hand") -> tuple[str, ...]:
    """(nbody,) the contact-filter class of every body: "active" (subtree of ``gripper`` or of a body with a
    free joint), "table" (:data:`TABLE_BODIES`; the world holds the floor), "jointed" (a joint on the path
    to the world), else "static"."""
    roots = {model.body(gripper).id}
    roots |= {int(model.jnt_bodyid[j]) for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE}
    out = []
    for b in range(model.nbody):
        path, a = [], b
        while True:
            path.append(a)
            if a == 0:
                break
            a = int(model.body_parentid[a])
        if any(p in roots for p in path):
            out.append(ACTIVE)
        elif model.body(b).name in TABLE_BODIES:
            out.append(TABLE)
        elif any(model.body_jntnum[p] > 0 for p in path):
            out.append(JOINTED)
        else:
            out.append(STATIC)
    return tuple(out)


def _retarget_geom_sensors(spec: mujoco.MjSpec, geom: mujoco.MjsGeom) -> None:
    """Sensors that read ``geom``'s frame read a new site at the geom's (original) frame instead."""
    users = [s for s in spec.sensors if s.objtype == mujoco.mjtObj.mjOBJ_GEOM and s.objname == geom.name]
    if not users:
        return
    site = geom.parent.add_site()
    site.name = f"ij_frame_{geom.name}"
    site.pos = np.array(geom.pos).tolist()
    site.quat = np.array(geom.quat).tolist()
    site.group = 5
    for sensor in users:
        sensor.objtype = mujoco.mjtObj.mjOBJ_SITE
        sensor.objname = site.name


def _check_same_structure(a: mujoco.MjModel, b: mujoco.MjModel) -> None:
    """The transform keeps every state/control dimension, geom position, inertia and sensor reading."""
    for field in ("nq", "nv", "nu", "nmocap", "neq", "nbody", "ngeom", "nsensordata"):
        if getattr(a, field) != getattr(b, field):
            raise AssertionError(f"the MJX transform changed {field}: {getattr(a, field)} -> {getattr(b, field)}")
    d_pos = np.abs(a.geom_pos - b.geom_pos).max()
    if d_pos > 1e-9:
        raise AssertionError(f"the MJX transform moved a geom (|Δpos| {d_pos:.2e})")
    da, db = mujoco.MjData(a), mujoco.MjData(b)
    mujoco.mj_forward(a, da)
    mujoco.mj_forward(b, db)
    d_sens = np.abs(da.sensordata - db.sensordata).max() if a.nsensordata else 0.0
    if d_sens > 1e-9:
        raise AssertionError(f"the MJX transform changed a sensor reading at qpos0 (|Δ| {d_sens:.2e})")
    d_mass = np.abs(a.body_mass - b.body_mass).max()
    d_inertia = np.abs(a.body_inertia - b.body_inertia).max()
    if d_mass > 1e-9 or d_inertia > 1e-9:
        raise AssertionError(f"the MJX transform changed inertia (|Δmass| {d_mass:.2e}, |Δinertia| {d_inertia:.2e})")


def _pair_set(model: mujoco.MjModel) -> set[tuple[int, int]]:
    from mujoco.mjx._src import collision_driver

    return {tuple(sorted((int(g1), int(g2)))) for g1, g2, _ in collision_driver.geom_pairs(model)}


def _check_pairs(original: mujoco.MjModel, model: mujoco.MjModel, classes: tuple[str, ...]) -> None:
    """The candidate pairs are exactly the original's whose classes are kept, without a plane."""
    def kept(a: int, b: int) -> bool:
        pair = frozenset((classes[original.geom_bodyid[a]], classes[original.geom_bodyid[b]]))
        plane = mujoco.mjtGeom.mjGEOM_PLANE in (original.geom_type[a], original.geom_type[b])
        return pair in _KEPT and not plane

    want = {p for p in _pair_set(original) if kept(*p)}
    got = _pair_set(model)
    if got != want:
        raise AssertionError(f"the MJX transform's contact filter is wrong: {len(got - want)} pairs added, "
                             f"{len(want - got)} pairs lost")


def candidate_pairs(model: mujoco.MjModel) -> int:
    """Number of geom pairs MJX checks at every step (its static contact candidates)."""
    from mujoco.mjx._src import collision_driver  # the same enumeration put_model uses

    return sum(1 for _ in collision_driver.geom_pairs(model))
