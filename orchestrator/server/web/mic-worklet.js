// The microphone's AudioWorklet: the capture, at the AudioContext's own rate, resampled to the
// realtime session's input rate (16 or 24 kHz) and cut into 20 ms frames of pcm16 LE mono,
// each posted to the page (app.js), which sends it as input_audio_buffer.append.
//
// Loaded with audioWorklet.addModule("static/mic-worklet.js"): a file of this server, since
// the page's Content-Security-Policy (script-src 'self') refuses a blob: module.
"use strict";

const FRAME_MS = 20;          // one append per 20 ms: what OpenAI's realtime clients send
const ZERO_CROSSINGS = 8;     // sinc lobes on each side of a resampled point: ~60 dB stopband with a Hann window
const CUTOFF = 0.9;           // the low-pass edge as a fraction of the output's Nyquist: leaves room for the window's roll-off
const PHASES = 256;           // kernels precomputed per 1/256 of an input sample: a point is off by < 0.2 % of a sample

/** Band-limited resampling: each output sample a Hann-windowed sinc of the input around it. */
class MicFrames extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.configure((options.processorOptions || {}).rate || 16000);
    this.port.onmessage = (event) => {
      if (event.data && event.data.rate) this.configure(event.data.rate);
    };
  }

  configure(rate) {
    this.rate = rate;
    this.step = sampleRate / rate;                    // input samples per output sample
    this.same = Math.abs(this.step - 1) < 1e-9;
    this.fc = Math.min(1, rate / sampleRate) * CUTOFF; // cut-off, as a fraction of the input's Nyquist
    this.half = Math.ceil(ZERO_CROSSINGS / this.fc);  // taps on each side of a point
    const taps = 2 * this.half;
    this.kernels = new Float32Array(this.same ? 0 : (PHASES + 1) * taps);
    for (let phase = 0; !this.same && phase <= PHASES; phase++) {
      for (let j = 0; j < taps; j++) {
        const t = j - this.half + 1 - phase / PHASES;   // distance from the point, in input samples
        const window = 0.5 + 0.5 * Math.cos((Math.PI * t) / this.half);
        const arg = Math.PI * this.fc * t;
        this.kernels[phase * taps + j] = this.fc * (Math.abs(arg) < 1e-9 ? 1 : Math.sin(arg) / arg) * window;
      }
    }
    this.history = new Float32Array(0);               // input not yet consumed, from index `base`
    this.pos = this.half;                             // the next output's position in `history`
    this.frame = new Int16Array(Math.round((rate * FRAME_MS) / 1000));
    this.filled = 0;
    this.energy = 0;
  }

  push(value) {
    const v = Math.max(-1, Math.min(1, value));
    this.frame[this.filled++] = v < 0 ? Math.round(v * 32768) : Math.round(v * 32767);
    this.energy += v * v;
    if (this.filled === this.frame.length) {
      const length = this.frame.length;               // read before the transfer detaches it
      const pcm = this.frame.buffer;
      this.port.postMessage({ pcm, rms: Math.sqrt(this.energy / length) }, [pcm]);
      this.frame = new Int16Array(length);
      this.filled = 0;
      this.energy = 0;
    }
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || !input.length) return true;
    const n = input[0].length;
    const mono = new Float32Array(n);
    for (const channel of input) for (let i = 0; i < n; i++) mono[i] += channel[i] / input.length;
    if (this.same) {
      for (let i = 0; i < n; i++) this.push(mono[i]);
      return true;
    }
    const joined = new Float32Array(this.history.length + n);
    joined.set(this.history);
    joined.set(mono, this.history.length);
    const x = joined;
    const { half } = this;
    const taps = 2 * half;
    while (this.pos + half < x.length) {
      const center = Math.floor(this.pos);
      const k0 = Math.round((this.pos - center) * PHASES) * taps;
      const first = center - half + 1;
      let acc = 0;
      for (let j = 0; j < taps; j++) acc += x[first + j] * this.kernels[k0 + j];
      this.push(acc);
      this.pos += this.step;
    }
    const keep = Math.floor(this.pos) - half;           // what the next points still need
    this.history = x.slice(keep);
    this.pos -= keep;
    return true;
  }
}

registerProcessor("mic-frames", MicFrames);
