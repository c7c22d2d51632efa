// The scene3d simulation: one fixed step of 1/60 s at a time, in this order: keyboard controls,
// scripts, behaviours (spin, orbit, bob), rigid bodies, pickups, the HUD's text.
// Deterministic: the same scene and the same keys held for the same steps give the same state.
//
// Physics is deliberately small: colliders are axis-aligned boxes (a sphere collider is its
// bounding box) centred on their entity, rotation ignored; dynamic bodies fall under gravity,
// stop on the ground plane (y = 0) and on static colliders (an entity with a collider and no body,
// or a static body), bouncing by the pair's mean restitution and slowed by friction while they
// touch; dynamic bodies do not collide with each other. Bodies move in their parent's frame: keep
// them at the top level. A controlled entity with a collider is stopped by static colliders.

export const STEP = 1 / 60;
const DEG = Math.PI / 180;
const GRAVITY = 9.81;
const REST_SPEED = 0.3;  // a bounce slower than this (m/s) comes to rest
const KEYS = {arrows: {ArrowUp: [0, -1], ArrowDown: [0, 1], ArrowLeft: [-1, 0], ArrowRight: [1, 0]},
  wasd: {w: [0, -1], s: [0, 1], a: [-1, 0], d: [1, 0], W: [0, -1], S: [0, 1], A: [-1, 0], D: [1, 0]}};
const PLANE = {x: ['y', 'z', 1], y: ['x', 'z', -1], z: ['x', 'y', 1]};  // axis -> the circle's axes and the second's sign

export class Sim {
  constructor(THREE, scene, entities, keys) {
    this.THREE = THREE;
    this.keys = keys;
    this.time = 0;
    this.score = 0;
    this.entities = entities;
    this.byName = Object.fromEntries(entities.map((e) => [e.name, e]));
    for (const e of entities) {
      e.start = e.obj.position.clone();
      if (e.c.body) e.v = new THREE.Vector3().fromArray(e.c.body.velocity);
      e.half = this._half(e);
      if (e.c.script) this._compile(e);
    }
    this.obstacles = entities.filter((e) => e.c.collider && (!e.c.body || e.c.body.type === 'static'));
    const sim = this;
    this.ctx = {  // what a script sees besides itself and dt
      THREE, key: (k) => keys.has(k), find: (n) => (this.byName[n] ? this.byName[n].obj : null),
      addScore: (n) => { this.score += Number(n) || 0; },
      get time() { return sim.time; }, get score() { return sim.score; },
    };
    this._hud();
  }

  step() {
    this.time += STEP;
    for (const e of this.entities) if (e.c.controls) this._control(e);
    for (const e of this.entities) if (e.fn) this._script(e);
    for (const e of this.entities) if (e.c.behaviour) this._behave(e);
    for (const e of this.entities) if (e.c.body && e.c.body.type === 'dynamic') this._fall(e);
    this._collect();
    this._hud();
  }

  velocity(name) { const e = this.byName[name]; return e && e.v ? e.v.toArray() : null; }
  taken(name) { const e = this.byName[name]; return !!(e && e.taken); }
  scriptError(name) { const e = this.byName[name]; return e ? e.error || null : null; }

  // ---- parts of a step --------------------------------------------------------------
  _control(e) {
    const c = e.c.controls, map = KEYS[c.keys];
    let dx = 0, dz = 0;
    for (const k of this.keys) if (map[k]) { dx += map[k][0]; dz += map[k][1]; }
    const p = e.obj.position, d = c.speed * STEP;
    for (const [axis, delta] of [['x', dx * d], ['z', dz * d]]) {
      if (!delta) continue;
      p[axis] += delta;
      if (e.c.collider && this.obstacles.some((o) => o !== e && this._overlap(e, o))) p[axis] -= delta;
    }
  }

  _script(e) {
    try {
      e.fn(e.obj, STEP, this.ctx);
    } catch (err) {
      e.error = String(err && err.message || err);
      e.fn = null;  // a broken script stops, reported once
      window.__errors.push(`script on ${e.name}: ${e.error}`);
    }
  }

  _compile(e) {
    try {
      e.fn = new Function('self', 'dt', 'ctx', e.c.script.source);
    } catch (err) {
      e.error = String(err && err.message || err);
      window.__errors.push(`script on ${e.name} does not compile: ${e.error}`);
    }
  }

  _behave(e) {
    const b = e.c.behaviour, o = e.obj;
    if (b.type === 'spin') {
      o.rotation[b.axis] += b.rate * DEG * STEP;
    } else if (b.type === 'orbit') {
      const [u, v, sign] = PLANE[b.axis], a = b.rate * DEG * this.time;
      const axis = {x: 0, y: 1, z: 2}, ctr = b.center;
      o.position[u] = ctr[axis[u]] + b.radius * Math.cos(a);
      o.position[v] = ctr[axis[v]] + sign * b.radius * Math.sin(a);
    } else if (b.type === 'bob') {
      o.position[b.axis] = e.start[b.axis] + b.amplitude * Math.sin(2 * Math.PI * this.time / b.period);
    }
  }

  _fall(e) {
    const p = e.obj.position, v = e.v, col = e.c.collider || {restitution: 0.2, friction: 0.5};
    if (e.c.body.gravity) v.y -= GRAVITY * STEP;
    p.addScaledVector(v, STEP);
    let touching = false;
    if (p.y - e.half[1] < 0) {  // the ground plane
      p.y = e.half[1];
      if (v.y < 0) v.y = -v.y * col.restitution;
      if (Math.abs(v.y) < REST_SPEED) v.y = 0;
      touching = true;
    }
    for (const o of this.obstacles) {
      if (o === e || !this._overlap(e, o)) continue;
      const q = o.obj.position, axes = ['x', 'y', 'z'];
      let best = null;
      axes.forEach((ax, i) => {  // push out along the axis of least penetration
        const depth = e.half[i] + o.half[i] - Math.abs(p[ax] - q[ax]);
        if (best === null || depth < best.depth) best = {ax, depth, dir: p[ax] >= q[ax] ? 1 : -1};
      });
      p[best.ax] += best.dir * best.depth;
      const e2 = (col.restitution + o.c.collider.restitution) / 2;
      if (v[best.ax] * best.dir < 0) v[best.ax] = -v[best.ax] * e2;
      if (Math.abs(v[best.ax]) < REST_SPEED) v[best.ax] = 0;
      touching = true;
    }
    if (touching) {  // friction on the sliding speed
      const slide = Math.hypot(v.x, v.z), drop = col.friction * GRAVITY * STEP;
      const k = slide > drop ? (slide - drop) / slide : 0;
      v.x *= k;
      v.z *= k;
    }
  }

  _collect() {
    const players = this.entities.filter((e) => e.c.controls);
    for (const e of this.entities) {
      if (!e.c.pickup || e.taken) continue;
      if (players.some((p) => this._overlap(p, e))) {
        e.taken = true;
        e.obj.visible = false;
        this.score += e.c.pickup.points;
      }
    }
  }

  _hud() {
    for (const e of this.entities) {
      if (!e.hud) continue;
      const text = e.c.hud.text.replaceAll('{score}', String(this.score)).replaceAll('{time}', this.time.toFixed(1));
      if (e.hud.textContent !== text) e.hud.textContent = text;
    }
  }

  // ---- boxes ------------------------------------------------------------------------
  // half extents of the entity's box: its collider's, else its drawn box's at the start
  _half(e) {
    const c = e.c.collider;
    if (c) return c.shape === 'sphere' ? [c.radius, c.radius, c.radius] : c.size.map((s) => s / 2);
    const box = new this.THREE.Box3().setFromObject(e.obj);
    if (box.isEmpty()) return [0, 0, 0];
    const size = box.getSize(new this.THREE.Vector3());
    return [size.x / 2, size.y / 2, size.z / 2];
  }

  _overlap(a, b) {
    const p = a.obj.getWorldPosition(new this.THREE.Vector3()), q = b.obj.getWorldPosition(new this.THREE.Vector3());
    const pa = [p.x, p.y, p.z], qb = [q.x, q.y, q.z];
    return [0, 1, 2].every((i) => Math.abs(pa[i] - qb[i]) < a.half[i] + b.half[i] - 1e-9);
  }
}
