// omni-edge's page: ask the served pipeline, read the reply as it streams, hear
// its audio as it arrives, and watch the pipeline (GET v1/status every 2 s).
//
// Plain JavaScript, no build step, nothing fetched from anywhere but this server.
// window.omniEdge exposes what the page is doing (state, text, audio, status) so
// that a test driving a browser can read it; the page itself never reads it back.
"use strict";

const SAMPLE_RATE = 24000;        // the contract's streamed audio: pcm16 LE mono 24 kHz
const STATUS_EVERY_MS = 2000;
const HISTORY_MESSAGES = 8;       // earlier turns sent with a prompt (the model's context is small)
const RECENT_ROWS = 8;

const $ = (id) => document.getElementById(id);

const page = {
  state: "idle",                  // idle | waiting | streaming | done | stopped | error
  text: "",
  error: null,
  firstTextMs: null,
  firstAudioMs: null,
  status: null,
  statusError: null,
  history: [],                    // [{role, content}] of finished turns
};

// ---------------------------------------------------------------- audio

/** Plays pcm16 chunks back to back on one AudioContext, each the moment it arrives. */
class ChunkPlayer {
  constructor() {
    this.ctx = null;
    this.nextTime = 0;            // context time at which the next chunk starts
    this.chunks = 0;
    this.samples = 0;
    this.startedAt = null;        // context time the first chunk of this reply starts playing
    this.carry = null;            // an odd trailing byte, kept for the next chunk
    this.sources = new Set();
  }

  /** Creates or resumes the context; call from a user gesture (browsers' autoplay rules). */
  unlock() {
    if (!this.ctx) {
      const Ctx = window.AudioContext || window.webkitAudioContext;
      if (!Ctx) return;
      try {
        this.ctx = new Ctx({ sampleRate: SAMPLE_RATE });
      } catch (_) {
        this.ctx = new Ctx();     // resamples 24 kHz buffers itself
      }
    }
    if (this.ctx.state === "suspended") this.ctx.resume();
  }

  reset() {
    this.stop();
    this.chunks = 0;
    this.samples = 0;
    this.startedAt = null;
    this.carry = null;
  }

  stop() {
    for (const s of this.sources) {
      try { s.stop(); } catch (_) { /* already ended */ }
    }
    this.sources.clear();
    this.nextTime = 0;
  }

  /** Schedules one base64 chunk of pcm16 LE right after the previous one. */
  play(base64) {
    let bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    if (this.carry !== null) {
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = this.carry;
      joined.set(bytes, 1);
      bytes = joined;
      this.carry = null;
    }
    if (bytes.length % 2) {
      this.carry = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    const n = bytes.length / 2;
    this.chunks += 1;
    if (!n) return;
    this.samples += n;
    this.unlock();
    if (!this.ctx) return;
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const buffer = this.ctx.createBuffer(1, n, SAMPLE_RATE);
    const out = buffer.getChannelData(0);
    for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true) / 32768;
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    const at = Math.max(this.nextTime, this.ctx.currentTime + 0.03);
    source.start(at);
    source.onended = () => { this.sources.delete(source); render(); };
    this.sources.add(source);
    this.nextTime = at + buffer.duration;
    if (this.startedAt === null) this.startedAt = at;
  }

  /** What a test (or the meter) reads: counts, and whether the context is playing them. */
  snapshot() {
    const now = this.ctx ? this.ctx.currentTime : 0;
    return {
      chunks: this.chunks,
      samples: this.samples,
      seconds: this.samples / SAMPLE_RATE,
      startedAt: this.startedAt,
      contextTime: now,
      contextState: this.ctx ? this.ctx.state : "none",
      playing: this.startedAt !== null && now >= this.startedAt && now < this.nextTime,
      played: this.startedAt !== null && now > this.startedAt,
    };
  }
}

const player = new ChunkPlayer();

window.omniEdge = {
  get state() { return page.state; },
  get text() { return page.text; },
  get error() { return page.error; },
  get firstTextMs() { return page.firstTextMs; },
  get firstAudioMs() { return page.firstAudioMs; },
  get status() { return page.status; },
  get audio() { return player.snapshot(); },
};

// ---------------------------------------------------------------- requests

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

/** The server's error as one line: OpenAI's {"error": {"message"}} or the status text. */
async function errorText(response) {
  if (response.status === 401) $("key-row").hidden = false;
  try {
    const doc = await response.json();
    if (doc && doc.error && doc.error.message) {
      const retry = response.headers.get("Retry-After");
      return `${response.status}: ${doc.error.message}${retry ? ` (retry after ${retry} s)` : ""}`;
    }
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

let controller = null;

async function ask(prompt, speak) {
  controller = new AbortController();
  const started = performance.now();
  Object.assign(page, { state: "waiting", text: "", error: null, firstTextMs: null, firstAudioMs: null });
  player.reset();
  if (speak) player.unlock();
  const turn = addTurn(prompt);
  turn.reply.setAttribute("aria-busy", "true");  // read out once it is complete
  const messages = [...page.history.slice(-HISTORY_MESSAGES), { role: "user", content: prompt }];
  const body = { model: (page.status && page.status.pipeline) || "omni-edge", messages, stream: true };
  if (speak) Object.assign(body, { modalities: ["text", "audio"], audio: { voice: "default", format: "pcm16" } });
  render();

  let content = "";
  let transcript = "";
  const onChunk = (doc) => {
    if (doc.error) throw new Error(doc.error.message || "the server reported an error");
    const delta = (doc.choices && doc.choices[0] && doc.choices[0].delta) || {};
    if (typeof delta.content === "string") content += delta.content;
    if (delta.audio && typeof delta.audio.transcript === "string") transcript += delta.audio.transcript;
    if (delta.audio && delta.audio.data) {
      if (page.firstAudioMs === null) page.firstAudioMs = performance.now() - started;
      player.play(delta.audio.data);
    }
    // OpenAI sends the spoken text as the audio's transcript, not as content;
    // either one is the reply's text.
    page.text = content || transcript;
    if (page.text && page.firstTextMs === null) page.firstTextMs = performance.now() - started;
    if (page.state === "waiting" && (page.text || player.chunks)) page.state = "streaming";
    turn.reply.textContent = page.text;
    render();
  };

  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, onChunk);
    page.state = "done";
    page.history.push({ role: "user", content: prompt }, { role: "assistant", content: page.text });
  } catch (err) {
    if (err.name === "AbortError") {
      page.state = "stopped";
      player.stop();
    } else {
      page.state = "error";
      page.error = String(err.message || err);
      turn.reply.classList.add("failed");
      turn.reply.textContent = page.text ? `${page.text}\n\n${page.error}` : page.error;
    }
  } finally {
    controller = null;
    turn.item.classList.remove("pending");
    turn.reply.removeAttribute("aria-busy");
    render();
  }
}

/** Reads server-sent events ("data: {json}" blocks, then "data: [DONE]") as they arrive. */
async function readEvents(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = pending.search(/\r?\n\r?\n/)) >= 0) {
      const block = pending.slice(0, cut);
      pending = pending.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      onChunk(JSON.parse(data));
    }
  }
}

// ---------------------------------------------------------------- conversation

function addTurn(prompt) {
  const item = document.createElement("li");
  item.className = "turn pending";
  const you = document.createElement("p");
  you.className = "you";
  you.textContent = prompt;
  const reply = document.createElement("p");
  reply.className = "reply";
  item.append(you, reply);
  $("conversation").append(item);
  item.scrollIntoView({ block: "nearest" });
  return { item, reply };
}

// ---------------------------------------------------------------- status panel

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(v >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
}

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function stageState(stage) {
  if (stage.alive === false) return ["down", "down"];
  if (stage.loaded === false) return ["loading", "loading"];
  return ["up", stage.loaded === undefined ? "alive" : "loaded"];
}

function renderStages(stages) {
  const list = $("stages");
  list.replaceChildren(...stages.map((s) => {
    const [cls, word] = stageState(s);
    const item = el("li", `stage stage-${cls}`);
    item.dataset.stage = s.name;
    const head = el("div", "stage-head");
    head.append(el("span", "stage-name", s.name), el("span", `badge badge-${cls}`, word));
    const facts = el("dl", "stage-facts");
    for (const [k, v] of [["device", s.device], ["backend", s.backend], ["kind", s.kind],
      ["output", s.final_output_type]]) {
      if (v === undefined || v === null) continue;
      const dt = el("dt", "", k);
      const dd = el("dd", k === "device" ? "device" : "", String(v));
      facts.append(dt, dd);
    }
    item.append(head, facts);
    if (s.error) item.append(el("p", "stage-error", s.error));
    item.setAttribute("aria-label", `${s.name} on ${s.device}: ${word}`);
    return item;
  }));
}

function renderPools(pools) {
  const box = $("pools");
  if (!pools) {
    box.replaceChildren(el("p", "empty", "Pools appear once the server reports them (GET v1/status)."));
    return;
  }
  box.replaceChildren(...pools.map((p) => {
    const cap = p.capacity_bytes || Math.max(p.budget_bytes || 0, p.measured_peak_bytes || 0, 1);
    const pct = (n) => `${Math.min(100, (100 * (n || 0)) / cap).toFixed(2)}%`;
    const row = el("div", "pool");
    row.dataset.pool = p.id;
    const label = el("div", "pool-head");
    label.append(el("span", "pool-id", p.id),
      el("span", "pool-nums", `budget ${bytes(p.budget_bytes)} · peak ${bytes(p.measured_peak_bytes)}`
        + ` · reserved ${bytes(p.reserved_bytes)} · of ${bytes(p.capacity_bytes)}`));
    const bar = el("div", "bar");
    bar.setAttribute("role", "img");
    bar.setAttribute("aria-label", `${p.id}: budget ${bytes(p.budget_bytes)}, measured peak `
      + `${bytes(p.measured_peak_bytes)}, reserved ${bytes(p.reserved_bytes)}, capacity ${bytes(p.capacity_bytes)}`);
    const budget = el("span", "bar-budget");
    budget.style.width = pct(p.budget_bytes);
    const reserved = el("span", "bar-reserved");
    reserved.style.width = pct(p.reserved_bytes);
    bar.append(budget, reserved);
    if (p.measured_peak_bytes !== null && p.measured_peak_bytes !== undefined) {
      const peak = el("span", "bar-peak");
      peak.style.left = pct(p.measured_peak_bytes);
      bar.append(peak);
    }
    row.append(label, bar);
    return row;
  }));
}

function renderRecent(recent, stageNames) {
  const rows = (recent || []).slice(-RECENT_ROWS).reverse();
  $("recent-empty").hidden = rows.length > 0;
  $("recent").hidden = rows.length === 0;
  if (!rows.length) return;
  const longest = Math.max(...rows.map((r) => r.total_s || 0), 1e-3);
  const head = el("tr");
  for (const h of ["request", "first token", "first audio", "total", ...stageNames]) {
    const th = el("th", "", h);
    th.scope = "col";
    head.append(th);
  }
  $("recent").tHead.replaceChildren(head);
  $("recent").tBodies[0].replaceChildren(...rows.map((r) => {
    const tr = el("tr");
    const id = el("th", "rid", (r.request_id || "").slice(0, 8));
    id.scope = "row";
    tr.append(id, el("td", "num", seconds(r.time_to_first_token_s)),
      el("td", "num", seconds(r.time_to_first_audio_s)), el("td", "num", seconds(r.total_s)));
    for (const name of stageNames) {
      const t = (r.stages || {})[name];
      const td = el("td", "span");
      if (t) {
        const track = el("div", "span-track");
        const done = el("span", "span-done");
        done.style.width = `${(100 * (t.done_s || 0)) / longest}%`;
        const first = el("span", "span-first");
        first.style.width = `${(100 * (t.time_to_first_output_s || 0)) / longest}%`;
        track.append(done, first);
        td.append(track, el("span", "span-text",
          `${seconds(t.time_to_first_output_s)} → ${seconds(t.done_s)}`));
        td.title = `${name}: first output after ${seconds(t.time_to_first_output_s)}, done after ${seconds(t.done_s)}`;
      } else {
        td.textContent = "–";
      }
      tr.append(td);
    }
    return tr;
  }));
}

/** The admission queue, where the server reports it: requests running, waiting, and the bounds. */
function renderQueue(queue) {
  const line = $("queue");
  line.hidden = !queue;
  if (!queue) return;
  const bound = queue.max_waiting === null || queue.max_waiting === undefined ? "" : ` (at most ${queue.max_waiting})`;
  line.textContent = `Requests: ${queue.in_flight} running of ${queue.limit} slots · ${queue.waiting} waiting${bound}`;
}

function renderStatus() {
  const s = page.status;
  if (!s) return;
  $("pipeline-name").textContent = s.pipeline || "";
  document.title = s.pipeline ? `${s.pipeline} · omni-edge` : "omni-edge";
  renderStages(s.stages || []);
  renderQueue(s.queue);
  renderPools(s.pools);
  renderRecent(s.recent, (s.stages || []).map((st) => st.name));
  const down = (s.stages || []).filter((st) => st.alive === false).map((st) => `${st.name} on ${st.device}`);
  $("server-state").textContent = page.statusError ? page.statusError
    : down.length ? `unavailable: ${down.join(", ")} down` : "serving";
  $("server-state").className = `server-state ${page.statusError || down.length ? "bad" : "good"}`;
}

let statusPath = "v1/status";

/** GET v1/status (GET health where a server has no status yet), then again in 2 s. */
async function pollStatus() {
  try {
    let response = await fetch(statusPath, { headers: headers(), cache: "no-store" });
    if (response.status === 404 && statusPath === "v1/status") {
      statusPath = "health";
      response = await fetch(statusPath, { headers: headers(), cache: "no-store" });
    }
    if (response.ok || (statusPath === "health" && response.status === 503)) {
      page.status = await response.json();
      page.statusError = null;
    } else {
      page.statusError = `status: ${await errorText(response)}`;
    }
  } catch (err) {
    page.statusError = "server unreachable";
  }
  renderStatus();
  setTimeout(pollStatus, STATUS_EVERY_MS);
}

// ---------------------------------------------------------------- the reply meter

function render() {
  const busy = page.state === "waiting" || page.state === "streaming";
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("reply-state").textContent = page.error ? `error — ${page.error}` : page.state;
  $("first-text").textContent = page.firstTextMs === null ? "–" : `${Math.round(page.firstTextMs)} ms`;
  $("first-audio").textContent = page.firstAudioMs === null ? "–" : `${Math.round(page.firstAudioMs)} ms`;
  const a = player.snapshot();
  $("audio-state").textContent = !a.chunks ? "–"
    : `${a.chunks} chunk${a.chunks === 1 ? "" : "s"}, ${a.seconds.toFixed(1)} s`
      + (a.playing ? " · playing" : a.played ? " · played" : " · queued");
}

// ---------------------------------------------------------------- wiring

function start() {
  $("ask").addEventListener("submit", (event) => {
    event.preventDefault();
    const prompt = $("prompt").value.trim();
    if (!prompt || controller) return;
    ask(prompt, $("speak").checked);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("ask").requestSubmit();
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("clear").addEventListener("click", () => {
    if (controller) controller.abort();
    page.history = [];
    $("conversation").replaceChildren();
    player.reset();
    Object.assign(page, { state: "idle", text: "", error: null, firstTextMs: null, firstAudioMs: null });
    render();
  });
  setInterval(render, 250);      // the audio meter follows playback between chunks
  render();
  pollStatus();
}

start();
