// The scene3d runtime: builds a Three.js scene from scene.json and renders it.
// Opened with ?verify it does not animate by itself: the verifier drives the clock through
// window.__scene.advance(seconds) and window.__scene.render(); otherwise it animates in real time.
import * as THREE from './three.module.js';

window.__errors = window.__errors || [];  // index.html sets it (and the error listeners) first

const DEG = Math.PI / 180;
const WIDTH = 320, HEIGHT = 240;  // small and fixed: the verifier reads every pixel

function geometryOf(mesh) {
  const [w, h, d] = mesh.size;
  switch (mesh.geometry) {
    case 'box': return new THREE.BoxGeometry(w, h, d);
    case 'sphere': return new THREE.SphereGeometry(mesh.radius, 24, 16);
    case 'plane': return new THREE.PlaneGeometry(w, h);
    case 'cylinder': return new THREE.CylinderGeometry(mesh.radius, mesh.radius, mesh.height, 24);
  }
  throw new Error('unknown geometry ' + mesh.geometry);
}

function objectOf(c) {
  if (c.camera) return new THREE.PerspectiveCamera(c.camera.fov, WIDTH / HEIGHT, c.camera.near, c.camera.far);
  if (c.light) {
    const l = c.light;
    if (l.type === 'ambient') return new THREE.AmbientLight(l.color, l.intensity);
    const light = l.type === 'directional' ? new THREE.DirectionalLight(l.color, l.intensity)
      : new THREE.PointLight(l.color, l.intensity, l.distance, 0);
    light.castShadow = l.cast_shadow;
    light.shadow.mapSize.set(512, 512);
    return light;
  }
  if (c.mesh) {
    const m = c.material || {color: '#cccccc', roughness: 0.5, metalness: 0.0};
    const mat = new THREE.MeshStandardMaterial({color: m.color, roughness: m.roughness, metalness: m.metalness});
    if (c.mesh.geometry === 'plane') mat.side = THREE.DoubleSide;
    const mesh = new THREE.Mesh(geometryOf(c.mesh), mat);
    mesh.castShadow = c.mesh.cast_shadow;
    mesh.receiveShadow = c.mesh.receive_shadow;
    return mesh;
  }
  return new THREE.Group();
}

function build(data) {
  const scene = new THREE.Scene();
  scene.background = new THREE.Color(data.background);
  const byName = {}, spins = [];
  let camera = null;
  for (const e of data.entities) {
    const c = e.components, obj = objectOf(c);
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
    if (c.behaviour && c.behaviour.type === 'spin') spins.push({obj, axis: c.behaviour.axis, rate: c.behaviour.rate});
  }
  if (!camera) {  // a scene without a camera is still viewable
    camera = new THREE.PerspectiveCamera(50, WIDTH / HEIGHT, 0.1, 200);
    camera.position.set(0, 4, 10);
    camera.lookAt(0, 0, 0);
  }
  return {scene, camera, spins};
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
  const data = await (await fetch('./scene.json')).json();
  const canvas = document.getElementById('view');
  const renderer = new THREE.WebGLRenderer({canvas, antialias: false, preserveDrawingBuffer: true});
  renderer.setPixelRatio(1);
  renderer.setSize(WIDTH, HEIGHT, false);
  renderer.shadowMap.enabled = true;
  const {scene, camera, spins} = build(data);
  const api = {
    time: 0, scene, camera, width: WIDTH, height: HEIGHT,
    advance(dt) {
      api.time += dt;
      for (const s of spins) s.obj.rotation[s.axis] += s.rate * DEG * dt;
    },
    render() { renderer.render(scene, camera); },
    names() { const out = []; scene.traverse((o) => { if (o.name) out.push(o.name); }); return out; },
    inspect(name) {
      const o = scene.getObjectByName(name);
      if (!o) return null;
      const out = {kind: o.type, parent: o.parent && o.parent !== scene ? o.parent.name : null,
        position: o.position.toArray(), rotation: [o.rotation.x, o.rotation.y, o.rotation.z].map((v) => v / DEG),
        scale: o.scale.toArray()};
      if (o.isMesh) {
        out.material = {color: '#' + o.material.color.getHexString(), roughness: o.material.roughness, metalness: o.material.metalness};
        out.mesh = {geometry: o.geometry.type, cast_shadow: o.castShadow, receive_shadow: o.receiveShadow};
      }
      if (o.isLight) out.light = {type: o.type, color: '#' + o.color.getHexString(), intensity: o.intensity, cast_shadow: !!o.castShadow};
      if (o.isCamera) out.camera = {fov: o.fov, active: o === camera};
      return out;
    },
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
      api.render();
      const withIt = frame(renderer);
      const was = o.visible;
      o.visible = false;
      api.render();
      const without = frame(renderer);
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
  };
  api.render();
  window.__scene = api;
  if (!new URLSearchParams(location.search).has('verify')) {
    const clock = new THREE.Clock();
    renderer.setAnimationLoop(() => { api.advance(clock.getDelta()); api.render(); });
  }
}

main().catch((e) => window.__errors.push('runtime: ' + (e && e.stack || e)));
