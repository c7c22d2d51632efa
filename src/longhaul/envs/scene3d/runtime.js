// The scene3d runtime: builds a Three.js scene from scene.json (and the prefabs of assets.json),
// steps its simulation (sim.js) and renders it.
// Opened with ?verify it does not animate by itself: the verifier drives the clock through
// window.__scene.advance(seconds) and window.__scene.render(); otherwise it animates in real time.
import * as THREE from './three.module.js';
import {Sim, STEP} from './sim.js';

window.__errors = window.__errors || [];  // index.html sets it (and the error listeners) first

const DEG = Math.PI / 180;
const WIDTH = 320, HEIGHT = 240;  // small and fixed: the verifier reads every pixel
const CORNERS = {'top-left': 'left:8px;top:8px', 'top-right': 'right:8px;top:8px',
  'bottom-left': 'left:8px;bottom:8px', 'bottom-right': 'right:8px;bottom:8px'};

function geometryOf(p) {
  const [w, h, d] = p.size;
  switch (p.geometry) {
    case 'box': return new THREE.BoxGeometry(w, h, d);
    case 'sphere': return new THREE.SphereGeometry(p.radius, 24, 16);
    case 'plane': return new THREE.PlaneGeometry(w, h);
    case 'cylinder': return new THREE.CylinderGeometry(p.radius, p.radius, p.height, 24);
  }
  throw new Error('unknown geometry ' + p.geometry);
}

function materialOf(m, geometry) {
  const mat = new THREE.MeshStandardMaterial({color: m.color, roughness: m.roughness, metalness: m.metalness});
  if (geometry === 'plane') mat.side = THREE.DoubleSide;
  return mat;
}

// (geometry, material, offset) of each part the entity draws: its mesh, or its asset's parts
function partsOf(c, assets) {
  if (c.asset) {
    const parts = assets[c.asset.name];
    if (!parts) throw new Error('unknown asset ' + c.asset.name);
    return parts.map((p) => ({geometry: geometryOf(p), offset: p.offset, shadow: [true, true],
      material: materialOf(c.material || {color: p.color, roughness: 0.8, metalness: 0.0}, p.geometry)}));
  }
  const m = c.material || {color: '#cccccc', roughness: 0.5, metalness: 0.0};
  return [{geometry: geometryOf(c.mesh), material: materialOf(m, c.mesh.geometry), offset: [0, 0, 0],
    shadow: [c.mesh.cast_shadow, c.mesh.receive_shadow]}];
}

function drawable(c, assets) {
  const parts = partsOf(c, assets);
  const positions = c.instances ? c.instances.positions : null;
  if (!positions && !c.asset) {
    const mesh = new THREE.Mesh(parts[0].geometry, parts[0].material);
    [mesh.castShadow, mesh.receiveShadow] = parts[0].shadow;
    return mesh;
  }
  const group = new THREE.Group();
  const m = new THREE.Matrix4();
  for (const p of parts) {
    let mesh;
    if (positions) {  // one draw call a part, however many copies
      mesh = new THREE.InstancedMesh(p.geometry, p.material, positions.length);
      positions.forEach((pos, i) => mesh.setMatrixAt(i, m.makeTranslation(pos[0] + p.offset[0], pos[1] + p.offset[1], pos[2] + p.offset[2])));
      mesh.computeBoundingSphere();
      mesh.computeBoundingBox();
    } else {
      mesh = new THREE.Mesh(p.geometry, p.material);
      mesh.position.fromArray(p.offset);
    }
    [mesh.castShadow, mesh.receiveShadow] = p.shadow;
    group.add(mesh);
  }
  return group;
}

function objectOf(c, assets) {
  if (c.camera) return new THREE.PerspectiveCamera(c.camera.fov, WIDTH / HEIGHT, c.camera.near, c.camera.far);
  if (c.light) {
    const l = c.light;
    if (l.type === 'ambient') return new THREE.AmbientLight(l.color, l.intensity);
    const light = l.type === 'directional' ? new THREE.DirectionalLight(l.color, l.intensity)
      : new THREE.PointLight(l.color, l.intensity, l.distance, 0);
    light.castShadow = l.cast_shadow;
    light.shadow.mapSize.set(512, 512);
    Object.assign(light.shadow.camera, {left: -10, right: 10, top: 10, bottom: -10});
    return light;
  }
  if (c.mesh || c.asset) return drawable(c, assets);
  return new THREE.Group();
}

function build(data, assets, hudRoot) {
  const scene = new THREE.Scene();
  scene.background = new THREE.Color(data.background);
  const entities = [];
  const byName = {};
  let camera = null;
  for (const e of data.entities) {
    const c = e.components, obj = objectOf(c, assets);
    obj.name = e.name;
    if (c.transform) {
      obj.position.fromArray(c.transform.position);
      obj.rotation.set(...c.transform.rotation.map((v) => v * DEG));
      obj.scale.fromArray(c.transform.scale);
    }
    (e.parent ? byName[e.parent] : scene).add(obj);
    byName[e.name] = obj;
    if (c.camera) {
      obj.updateMatrixWorld(true);
      obj.lookAt(...c.camera.look_at);
      camera = camera || obj;
    }
    let hud = null;
    if (c.hud) {
      hud = document.createElement('div');
      hud.className = 'hud';
      hud.dataset.entity = e.name;
      hud.style.cssText = `position:absolute;${CORNERS[c.hud.corner]};font:${c.hud.size}px sans-serif;color:${c.hud.color};` +
        'white-space:pre;pointer-events:none';
      hudRoot.appendChild(hud);
    }
    entities.push({name: e.name, obj, c, hud});
  }
  if (!camera) {  // a scene without a camera is still viewable
    camera = new THREE.PerspectiveCamera(50, WIDTH / HEIGHT, 0.1, 200);
    camera.position.set(0, 4, 10);
    camera.lookAt(0, 0, 0);
  }
  scene.updateMatrixWorld(true);
  return {scene, camera, entities};
}

function frame(renderer) {
  const gl = renderer.getContext();
  const px = new Uint8Array(WIDTH * HEIGHT * 4);
  gl.readPixels(0, 0, WIDTH, HEIGHT, gl.RGBA, gl.UNSIGNED_BYTE, px);
  return px;
}

function differing(a, b) {
  let n = 0;
  for (let i = 0; i < a.length; i += 4) {
    if (Math.abs(a[i] - b[i]) > 8 || Math.abs(a[i + 1] - b[i + 1]) > 8 || Math.abs(a[i + 2] - b[i + 2]) > 8) n++;
  }
  return n;
}

async function main() {
  const [data, assets] = await Promise.all([fetch('./scene.json'), fetch('./assets.json')].map((p) => p.then((r) => r.json())));
  const canvas = document.getElementById('view');
  const renderer = new THREE.WebGLRenderer({canvas, antialias: false, preserveDrawingBuffer: true});
  renderer.setPixelRatio(1);
  renderer.setSize(WIDTH, HEIGHT, false);
  renderer.shadowMap.enabled = true;
  const {scene, camera, entities} = build(data, assets, document.getElementById('hud'));
  const keys = new Set();
  window.addEventListener('keydown', (e) => keys.add(e.key));
  window.addEventListener('keyup', (e) => keys.delete(e.key));
  const sim = new Sim(THREE, scene, entities, keys);
  const byName = Object.fromEntries(entities.map((e) => [e.name, e]));
  const api = {
    scene, camera, width: WIDTH, height: HEIGHT,
    get time() { return sim.time; },
    get score() { return sim.score; },
    advance(dt) { for (let n = Math.round(dt / STEP); n > 0; n--) sim.step(); },
    render() { renderer.render(scene, camera); },
    names() { const out = []; scene.traverse((o) => { if (o.name) out.push(o.name); }); return out; },
    inspect(name) {
      const o = scene.getObjectByName(name);
      if (!o) return null;
      const out = {kind: o.type, parent: o.parent && o.parent !== scene ? o.parent.name : null,
        position: o.position.toArray(), rotation: [o.rotation.x, o.rotation.y, o.rotation.z].map((v) => v / DEG),
        scale: o.scale.toArray(), visible: o.visible};
      const mesh = o.isMesh ? o : o.children.find((k) => k.isMesh);
      if (mesh) {
        out.material = {color: '#' + mesh.material.color.getHexString(), roughness: mesh.material.roughness, metalness: mesh.material.metalness};
        out.mesh = {geometry: mesh.geometry.type, cast_shadow: mesh.castShadow, receive_shadow: mesh.receiveShadow};
      }
      if (o.isLight) out.light = {type: o.type, color: '#' + o.color.getHexString(), intensity: o.intensity, cast_shadow: !!o.castShadow};
      if (o.isCamera) out.camera = {fov: o.fov, active: o === camera};
      const e = byName[name];
      if (e) {
        const c = e.c;
        if (c.asset) out.asset = c.asset.name;
        if (c.instances) out.instances = c.instances.positions.length;
        if (e.hud) out.hud = {text: e.hud.textContent, corner: c.hud.corner};
        for (const k of ['behaviour', 'collider', 'controls', 'pickup']) if (c[k]) out[k] = {...c[k]};
        if (c.body) out.body = {...c.body, velocity: sim.velocity(name) || c.body.velocity};
        if (c.pickup) out.pickup.taken = sim.taken(name);
        if (c.script) out.script = {error: sim.scriptError(name)};
      }
      return out;
    },
    hud() { return [...document.querySelectorAll('#hud .hud')].map((d) => ({entity: d.dataset.entity, text: d.textContent})); },
    // pixels that the scene's content changes against the bare background
    drawn() {
      const shown = scene.children.map((o) => o.visible);
      scene.children.forEach((o) => { o.visible = false; });
      api.render();
      const bare = frame(renderer);
      scene.children.forEach((o, i) => { o.visible = shown[i]; });
      api.render();
      return {pixels: differing(bare, frame(renderer)), total: WIDTH * HEIGHT};
    },
    // pixels that `name` changes in the frame (occlusion and framing included) and whether its box projects on screen
    visible(name) {
      const o = scene.getObjectByName(name);
      if (!o) return null;
      const withIt = (api.render(), frame(renderer));
      const was = o.visible;
      o.visible = false;
      const without = (api.render(), frame(renderer));
      o.visible = was;
      api.render();
      camera.updateMatrixWorld(true);
      const box = new THREE.Box3().setFromObject(o);
      let onScreen = false;
      if (!box.isEmpty()) {
        for (let k = 0; k < 8; k++) {
          const p = new THREE.Vector3(k & 1 ? box.max.x : box.min.x, k & 2 ? box.max.y : box.min.y, k & 4 ? box.max.z : box.min.z);
          p.project(camera);
          if (Math.abs(p.x) <= 1 && Math.abs(p.y) <= 1 && p.z >= -1 && p.z <= 1) onScreen = true;
        }
      }
      return {pixels: differing(withIt, without), onScreen};
    },
    // pixels that the light `name`'s shadows change (its castShadow off against on)
    shadow(name) {
      const o = scene.getObjectByName(name);
      if (!o || !o.isLight) return null;
      const was = o.castShadow;
      o.castShadow = true;
      const withIt = (api.render(), frame(renderer));
      o.castShadow = false;
      const without = (api.render(), frame(renderer));
      o.castShadow = was;
      api.render();
      return {pixels: differing(withIt, without), casts: was};
    },
    // mean and spread of the frame's luminance, 0..255
    exposure() {
      api.render();
      const px = frame(renderer);
      let s = 0, s2 = 0;
      const n = WIDTH * HEIGHT;
      for (let i = 0; i < px.length; i += 4) {
        const y = 0.2126 * px[i] + 0.7152 * px[i + 1] + 0.0722 * px[i + 2];
        s += y;
        s2 += y * y;
      }
      const mean = s / n;
      return {mean, std: Math.sqrt(Math.max(0, s2 / n - mean * mean))};
    },
    // draw calls and triangles of one frame, and the mean time of `frames` frames (ms)
    budget(frames) {
      api.render();
      const {calls, triangles} = renderer.info.render;
      const t0 = performance.now();
      for (let i = 0; i < frames; i++) api.render();
      renderer.getContext().finish();
      return {calls, triangles, frame_ms: (performance.now() - t0) / frames};
    },
  };
  api.render();
  window.__scene = api;
  if (!new URLSearchParams(location.search).has('verify')) {
    const clock = new THREE.Clock();
    let owed = 0;
    renderer.setAnimationLoop(() => {
      owed = Math.min(owed + clock.getDelta(), 0.25);
      for (; owed >= STEP; owed -= STEP) sim.step();
      api.render();
    });
  }
}

main().catch((e) => window.__errors.push('runtime: ' + (e && e.stack || e)));
