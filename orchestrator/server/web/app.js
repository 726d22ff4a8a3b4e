// omni-edge's page: ask the served pipeline, read the reply as it streams, hear
// its audio as it arrives, talk to it (the microphone over the v1/realtime WebSocket), and
// watch the pipeline (GET v1/status every 2 s).
//
// Plain JavaScript, no build step, nothing fetched from anywhere but this server.
// window.omniEdge exposes what the page is doing (state, text, audio, status) so
// that a test driving a browser can read it; the page itself never reads it back.
"use strict";

const SAMPLE_RATE = 24000;        // the contract's streamed audio: pcm16 LE mono 24 kHz
const STATUS_EVERY_MS = 2000;
const HISTORY_MESSAGES = 8;       // earlier turns sent with a prompt (the model's context is small)
const RECENT_ROWS = 8;
const TALK_IN_RATE = 16000;       // the microphone's pcm16 rate asked of a realtime session: what speech models hear
const KEY_PROTOCOL = "openai-insecure-api-key.";  // how a browser sends the key on a WebSocket (OpenAI's subprotocol)
const TIMELINE_EVENTS = 500;      // server events (deltas aside) kept with their arrival times, for tests and debugging
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;   // what a WebSocket subprotocol may hold (RFC 7230 token)

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
    this.seconds = 0;
    this.bytes = 0;               // pcm16 bytes scheduled since the page opened (every reply)
    this.startedAt = null;        // context time the first chunk of this reply starts playing
    this.carry = null;            // an odd trailing byte, kept for the next chunk
    this.sources = new Set();
    this.cuts = 0;                // times scheduled audio was cut short (Stop, an interruption)
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
    this.newReply();
  }

  /** Counts from zero for the next reply; whatever still plays goes on. */
  newReply() {
    this.chunks = 0;
    this.samples = 0;
    this.seconds = 0;
    this.startedAt = null;
    this.carry = null;
  }

  /** Seconds of audio scheduled but not yet heard. */
  ahead() {
    return this.ctx && this.sources.size ? Math.max(0, this.nextTime - this.ctx.currentTime) : 0;
  }

  /** Silences everything scheduled at once; returns the seconds that were still to play. */
  stop() {
    const cut = this.ahead();
    for (const s of this.sources) {
      try { s.stop(); } catch (_) { /* already ended */ }
    }
    if (this.sources.size && cut > 0) this.cuts += 1;
    this.sources.clear();
    this.nextTime = 0;
    return cut;
  }

  /** Schedules one base64 chunk of pcm16 LE mono at `rate` right after the previous one. */
  play(base64, rate = SAMPLE_RATE) {
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
    this.seconds += n / rate;
    this.bytes += 2 * n;
    this.unlock();
    if (!this.ctx) return;
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const buffer = this.ctx.createBuffer(1, n, rate);
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
      seconds: this.seconds,
      bytes: this.bytes,
      ahead: this.ahead(),
      cuts: this.cuts,
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
  get talk() { return talkSnapshot(); },
  cspViolations: [],
};
document.addEventListener("securitypolicyviolation", (e) => {
  window.omniEdge.cspViolations.push(`${e.violatedDirective}: ${e.blockedURI}`);
});

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

// ---------------------------------------------------------------- talk (v1/realtime)

/** A spoken conversation: the microphone → AudioWorklet (pcm16 at the session's rate, 20 ms
 * frames) → input_audio_buffer.append on the WebSocket; the server finds the turns (server
 * VAD) and streams each reply's text and audio back; speaking over a reply stops it here at
 * once (the server cancels it). */
const talk = {
  state: "off",                   // off | connecting | listening | hearing | thinking | replying | closed | error
  ws: null,
  ctx: null,                      // the microphone's AudioContext
  stream: null,
  node: null,
  session: null,                  // the server's session document (session.updated)
  inRate: null,
  outRate: SAMPLE_RATE,
  framesSent: 0,
  bytesSent: 0,
  frameBytes: null,
  level: 0,
  events: {},                     // server event type → how many arrived
  timeline: [],                   // [performance.now() ms, type] of each server event but the deltas
  turns: new Map(),               // user item id → {itemId, transcript, item, you, reply}
  lastTurn: null,
  responses: new Map(),           // response id → {id, itemId, status, reason, text, audioBytes, interrupted, error}
  current: null,                  // the response in progress (between response.created and response.done)
  lastAudio: null,                // the response whose audio was scheduled last (it may still play after its done)
  interrupted: new Set(),         // responses stopped here: their late deltas are not played
  bargeIns: [],                   // {responseId, cutSeconds, running}
  stoppedAt: null,                // performance.now() when the last speech_stopped arrived
  error: null,
  reconnecting: false,            // a reply was cut by a stage restarting: said until a reply completes
  closed: null,                   // {code, reason} once the socket closed
};

function talkSnapshot() {
  return {
    state: talk.state, error: talk.error, reconnecting: talk.reconnecting, closed: talk.closed,
    inRate: talk.inRate, outRate: talk.outRate,
    framesSent: talk.framesSent, bytesSent: talk.bytesSent, frameBytes: talk.frameBytes,
    micRate: talk.ctx ? talk.ctx.sampleRate : null, level: talk.level, events: { ...talk.events },
    timeline: talk.timeline.slice(),
    turns: [...talk.turns.values()].map((t) => ({ itemId: t.itemId, transcript: t.transcript })),
    responses: [...talk.responses.values()].map((r) => ({ ...r, el: undefined })),
    bargeIns: talk.bargeIns.slice(),
  };
}

/** Milliseconds since the server said the user's speech stopped: the page's voice-to-voice clock. */
function sinceTurnEnd() {
  return talk.stoppedAt === null ? null : performance.now() - talk.stoppedAt;
}

function talkSay(text, bad = false) {
  $("talk-state").textContent = text;
  $("talk-state").classList.toggle("bad", bad);
}

const RECONNECTING = "reconnecting the voice…";
/** Said while a stage is coming back after its process died (code stage_restarting, or a stage
 * the status says is restarting): the session stays open and the next turn waits for it. */

const TALK_WORDS = {
  connecting: "Connecting…", listening: "Listening — speak now", hearing: "Hearing you…",
  thinking: "Thinking…", replying: "Replying — speak to interrupt",
};

function setTalk(state) {
  talk.state = state;
  if (TALK_WORDS[state]) talkSay(TALK_WORDS[state]);
  renderTalk();
}

function renderTalk() {
  const on = !["off", "closed", "error"].includes(talk.state);
  $("talk").disabled = on || Boolean(controller);
  $("talk").setAttribute("aria-pressed", String(on));
  $("talk-stop").disabled = !on;
  $("talk-text").disabled = $("talk-send").disabled = !talk.session;
  $("send").disabled = on || page.state === "waiting" || page.state === "streaming";
  $("mic-level").style.width = `${Math.min(100, Math.round(talk.level * 400))}%`;
}

function realtimeURL() {
  const url = new URL("v1/realtime", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

function send(doc) {
  if (talk.ws && talk.ws.readyState === WebSocket.OPEN) talk.ws.send(JSON.stringify(doc));
}

function base64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

async function startTalk() {
  if (!["off", "closed", "error"].includes(talk.state) || controller) return;
  player.unlock();                // in the click: browsers' autoplay rules
  Object.assign(talk, { error: null, closed: null, session: null, inRate: null, framesSent: 0, bytesSent: 0,
    frameBytes: null, current: null });
  setTalk("connecting");
  const key = $("api-key").value.trim();
  if (key && !TOKEN.test(key)) {
    failTalk("the API key holds characters a WebSocket subprotocol cannot carry");
    return;
  }
  try {
    const Ctx = window.AudioContext || window.webkitAudioContext;
    talk.ctx = new Ctx();
    talk.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    await talk.ctx.audioWorklet.addModule("static/mic-worklet.js");
  } catch (err) {
    failTalk(`the microphone: ${err.message || err.name || err}`);
    return;
  }
  if (talk.state !== "connecting") return;   // stopped meanwhile
  let ws;
  try {
    ws = new WebSocket(realtimeURL(), key ? ["realtime", KEY_PROTOCOL + key] : ["realtime"]);
  } catch (err) {
    failTalk(`the WebSocket: ${err.message || err}`);
    return;
  }
  talk.ws = ws;
  let opened = false;
  ws.onopen = () => {
    opened = true;
    send({
      type: "session.update",
      session: {
        modalities: $("speak").checked ? ["text", "audio"] : ["text"],
        input_audio_format: "pcm16", output_audio_format: "pcm16",
        input_audio_sample_rate: TALK_IN_RATE, output_audio_sample_rate: SAMPLE_RATE,
      },
    });
  };
  ws.onmessage = (event) => {
    let doc;
    try { doc = JSON.parse(event.data); } catch (_) { return; }
    onServerEvent(doc);
    renderTalk();
  };
  ws.onclose = async (event) => {
    if (talk.ws !== ws) return;
    talk.closed = { code: event.code, reason: event.reason };
    const byUs = talk.state === "off";
    endTalk();
    if (byUs) return;
    if (!opened) {
      // a refused upgrade reaches a page only as a close: ask the server why over HTTP
      let why = "the server refused the session";
      try {
        const r = await fetch("v1/models", { headers: headers(), cache: "no-store" });
        if (!r.ok) why = await errorText(r);
      } catch (_) { why = "server unreachable"; }
      failTalk(why);
      return;
    }
    talk.state = "closed";
    talkSay(`Session closed by the server${event.reason ? `: ${event.reason}` : ` (code ${event.code})`}`, event.code !== 1000);
    renderTalk();
  };
}

/** The microphone starts once the session says its input rate. */
function startMic(rate) {
  if (talk.node) {
    talk.node.port.postMessage({ rate });
    return;
  }
  const source = talk.ctx.createMediaStreamSource(talk.stream);
  const node = new AudioWorkletNode(talk.ctx, "mic-frames", { processorOptions: { rate }, numberOfOutputs: 1 });
  node.port.onmessage = (event) => {
    const { pcm, rms } = event.data;
    talk.level = rms;
    if (!talk.session) return;
    const bytes = new Uint8Array(pcm);
    send({ type: "input_audio_buffer.append", audio: base64(bytes) });
    talk.framesSent += 1;
    talk.bytesSent += bytes.length;
    talk.frameBytes = bytes.length;
  };
  source.connect(node);
  node.connect(talk.ctx.destination);  // its output is silence; connected, the graph pulls it
  talk.node = node;
  if (talk.ctx.state === "suspended") talk.ctx.resume();
}

function onServerEvent(doc) {
  const type = doc.type;
  talk.events[type] = (talk.events[type] || 0) + 1;
  if (!type.endsWith(".delta") && talk.timeline.length < TIMELINE_EVENTS) {
    talk.timeline.push([Math.round(performance.now()), type]);
  }
  switch (type) {
    case "session.created":
    case "session.updated": {
      const s = doc.session || {};
      if (!s.turn_detection) {
        failTalk("this pipeline detects no turns (it has no vad stage at its audio entry): type instead");
        return;
      }
      talk.session = s;
      talk.inRate = s.input_audio_sample_rate || SAMPLE_RATE;  // OpenAI's pcm16 is 24 kHz
      talk.outRate = s.output_audio_sample_rate || SAMPLE_RATE;
      if (type === "session.updated") {
        startMic(talk.inRate);
        setTalk("listening");
      }
      break;
    }
    case "input_audio_buffer.speech_started":
      bargeIn();
      setTalk("hearing");
      break;
    case "input_audio_buffer.speech_stopped":
      talk.stoppedAt = performance.now();
      setTalk("thinking");
      break;
    case "input_audio_buffer.committed":
      userTurn(doc.item_id);
      break;
    case "conversation.item.created":
      if (doc.item && doc.item.role === "user") {
        const c = (doc.item.content || [])[0] || {};
        heard(doc.item.id, typeof c.transcript === "string" ? c.transcript
          : typeof c.text === "string" ? c.text : null);   // a typed turn's input_text
      }
      break;
    case "conversation.item.input_audio_transcription.completed":
      heard(doc.item_id, doc.transcript);
      break;
    case "response.created":
      replyStarted((doc.response || {}).id);
      break;
    case "response.text.delta":
    case "response.audio_transcript.delta": {
      const r = talk.responses.get(doc.response_id);
      if (!r || talk.interrupted.has(r.id)) break;
      r.text += doc.delta || "";
      r.el.textContent = r.text;
      if (r.firstTextMs === null) r.firstTextMs = page.firstTextMs = sinceTurnEnd();
      if (talk.state === "thinking") setTalk("replying");
      break;
    }
    case "response.audio.delta": {
      const r = talk.responses.get(doc.response_id);
      if (!r || talk.interrupted.has(r.id)) break;
      const before = player.bytes;
      player.play(doc.delta, talk.outRate);
      r.audioBytes += player.bytes - before;
      if (r.firstAudioMs === null) r.firstAudioMs = page.firstAudioMs = sinceTurnEnd();
      talk.lastAudio = r.id;
      if (talk.state === "thinking") setTalk("replying");
      break;
    }
    case "response.done":
      replyDone(doc.response || {});
      break;
    case "error": {
      const e = doc.error || {};
      if (e.code === "stage_restarting") {
        // a stage's process died and is being restarted: the session stays, the next turn waits for it
        talk.reconnecting = true;
        talkSay(RECONNECTING);
        break;
      }
      talk.error = e.message || e.code || "the server reported an error";
      talkSay(`Error: ${talk.error}`, true);
      break;
    }
    default:
      break;
  }
}

/** Speech while a reply runs or plays: silence it now (the server cancels it and says so). */
function bargeIn() {
  const running = talk.current ? talk.responses.get(talk.current) : null;
  const cut = player.stop();
  const r = running || (cut > 0 ? talk.responses.get(talk.lastAudio) : null);
  if (!r) return;
  talk.bargeIns.push({ responseId: r.id, cutSeconds: cut, running: Boolean(running) });
  talk.interrupted.add(r.id);
  r.interrupted = true;
  r.el.classList.add("interrupted");
  r.el.dataset.note = "interrupted";
}

/** A typed turn in Talk mode: the text as the conversation's user item, then its response
 * (conversation.item.create + response.create); the reply is spoken as a spoken turn's is. */
function typeTurn() {
  const text = $("talk-text").value.trim();
  if (!text || !talk.session) return;
  $("talk-text").value = "";
  if (talk.current) send({ type: "response.cancel" });   // typing over a reply ends it,
  bargeIn();                                              // as speaking over it would
  send({ type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
  send({ type: "response.create" });
  talk.stoppedAt = performance.now();
  setTalk("thinking");
}

function userTurn(itemId) {
  if (talk.turns.has(itemId)) return talk.turns.get(itemId);
  const turn = addTurn("…");
  turn.item.classList.add("spoken");
  turn.you = turn.item.querySelector(".you");
  turn.you.classList.add("pending-text");
  const t = { itemId, transcript: null, ...turn };
  talk.turns.set(itemId, t);
  talk.lastTurn = t;
  return t;
}

function heard(itemId, transcript) {
  if (!itemId || transcript === null || transcript === undefined) return;
  const t = userTurn(itemId);
  t.transcript = transcript;
  t.you.textContent = transcript || "(nothing recognised)";
  t.you.classList.remove("pending-text");
}

function replyStarted(id) {
  if (!id) return;
  const t = talk.lastTurn || userTurn(`unknown-${id}`);
  let el = t.reply;
  if (talk.responses.size && [...talk.responses.values()].some((r) => r.el === el)) {
    el = document.createElement("p");       // a second reply to one turn (response.create)
    el.className = "reply";
    t.item.append(el);
  }
  el.setAttribute("aria-busy", "true");
  player.newReply();
  talk.responses.set(id, { id, itemId: t.itemId, status: "in_progress", reason: null, text: "", audioBytes: 0,
    interrupted: false, error: null, firstTextMs: null, firstAudioMs: null, el });
  page.firstTextMs = page.firstAudioMs = null;
  talk.current = id;
}

function replyDone(response) {
  const r = talk.responses.get(response.id);
  if (talk.current === response.id) talk.current = null;
  if (!r) return;
  const details = response.status_details || {};
  r.status = response.status || "completed";
  r.reason = details.reason || null;
  r.el.removeAttribute("aria-busy");
  r.el.closest(".turn").classList.remove("pending");
  if (r.status === "cancelled") {
    const t = talk.turns.get(r.itemId);
    if (t && t.transcript === null) t.you.textContent = "(cut before its transcript was final)";
    r.el.classList.add("interrupted");
    r.el.dataset.note = details.reason === "turn_detected" ? "interrupted" : "cancelled";
  } else if (r.status === "failed") {
    const restarting = details.error && details.error.code === "stage_restarting";
    r.error = restarting ? RECONNECTING : (details.error && details.error.message) || "the reply failed";
    r.el.classList.add("failed");
    r.el.textContent = r.text ? `${r.text}\n\n${r.error}` : r.error;
  } else if (r.status === "completed") {
    talk.reconnecting = false;
  }
  if (!["off", "closed", "error", "hearing"].includes(talk.state)) setTalk("listening");
  if (talk.reconnecting && talk.state === "listening") talkSay(RECONNECTING);
}

function failTalk(message) {
  endTalk();
  talk.state = "error";
  talk.error = message;
  talkSay(`Talk: ${message}`, true);
  renderTalk();
}

/** Closes the session, the microphone and the playback. */
function endTalk() {
  const ws = talk.ws;
  talk.ws = null;
  if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000, "the page stopped talking");
  if (talk.node) talk.node.port.onmessage = null;
  if (talk.stream) for (const track of talk.stream.getTracks()) track.stop();
  if (talk.ctx) talk.ctx.close().catch(() => {});
  Object.assign(talk, { node: null, stream: null, ctx: null, session: null, current: null, level: 0 });
  for (const r of talk.responses.values()) {
    if (r.status === "in_progress") {
      r.status = "stopped";
      r.el.removeAttribute("aria-busy");
      r.el.closest(".turn").classList.remove("pending");
    }
  }
}

function stopTalk() {
  talk.state = "off";
  endTalk();
  player.stop();
  talkSay("Talk ended.");
  renderTalk();
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

/** Whether a stage is coming back: its device actor restarting, or moving to its fallback. */
function restarting(stage) {
  return stage.code === "stage_restarting" || Boolean(stage.restart && stage.restart.state === "recovering");
}

function stageState(stage) {
  if (stage.alive === false && restarting(stage)) return ["loading", "restarting"];
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
  const gone = (s.stages || []).filter((st) => st.alive === false);
  const down = gone.filter((st) => !restarting(st)).map((st) => `${st.name} on ${st.device}`);
  const back = gone.filter(restarting).map((st) => st.name);
  $("server-state").textContent = page.statusError ? page.statusError
    : down.length ? `unavailable: ${down.join(", ")} down`
      : back.length ? `${RECONNECTING} (${back.join(", ")} restarting)` : "serving";
  $("server-state").className = `server-state ${page.statusError || down.length ? "bad" : back.length ? "wait" : "good"}`;
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
  $("stop").disabled = !busy;
  renderTalk();
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
    if (!prompt || controller || talk.ws) return;
    ask(prompt, $("speak").checked);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("ask").requestSubmit();
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("talk").addEventListener("click", () => startTalk());
  $("talk-stop").addEventListener("click", () => stopTalk());
  $("talk-send").addEventListener("click", () => typeTurn());
  $("talk-text").addEventListener("keydown", (event) => {
    if (event.key === "Enter") { event.preventDefault(); typeTurn(); }
  });
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
