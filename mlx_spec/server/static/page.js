// The token page: a chat over /v1/chat/completions (streamed, with the per-token report
// extension), every token coloured by its probability, its figures on hover or tap.
"use strict";

const $ = (id) => document.getElementById(id);
const SETTINGS = ["mtp", "thinking", "temperature", "top_k", "top_p", "max_tokens", "api_key"];
let messages = [];
let model = null;
let controller = null;
let attached = [];  // {kind: "image" | "audio", name, url (a data URL)}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function colour(p) {
  return `hsl(${Math.round(120 * Math.max(0, Math.min(1, p)))}, 75%, 82%)`;
}

// Bidirectional controls shown as their code points: one in a token (U+202E, say) would reorder
// every token after it on screen, each coloured box over another token's characters.
const BIDI_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
const shown = (text) => text.replace(BIDI_CONTROLS, (c) => `\u27e6U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}\u27e7`);
const pct = (p) => (p === null || p === undefined ? "–" : (100 * p).toFixed(p >= 0.995 || p < 0.001 ? 2 : 1) + " %");

// -- settings --------------------------------------------------------------------------------

function loadSettings() {
  const saved = JSON.parse(localStorage.getItem("mlx-spec") || "{}");
  for (const name of SETTINGS) {
    if (!(name in saved)) continue;
    const input = $(name);
    if (input.type === "checkbox") input.checked = saved[name];
    else input.value = saved[name];
  }
}

function saveSettings() {
  const out = {};
  for (const name of SETTINGS) out[name] = $(name).type === "checkbox" ? $(name).checked : $(name).value;
  localStorage.setItem("mlx-spec", JSON.stringify(out));
}

function number(name) {
  const v = $(name).value.trim();
  return v === "" ? undefined : Number(v);
}

// -- the conversation --------------------------------------------------------------------------

function addMessage(role, text) {
  const msg = el("div", "msg " + role);
  msg.append(el("div", "who", role === "user" ? "you" : $("model").textContent || "model"));
  const body = el("div", "body", text);
  msg.append(body);
  $("log").append(msg);
  msg.scrollIntoView({ block: "end" });
  return msg;
}

class Answer {
  constructor() {
    this.msg = addMessage("assistant", "");
    this.body = this.msg.querySelector(".body");
    this.thought = el("div", "thought");
    this.body.append(this.thought);
    this.text = "";
    this.callBox = null;
    this.calls = [];
  }

  add(report, delta) {
    if (report.stop || !report.text) return;
    const span = el("span", "tok" + (report.drafted ? " kept" : ""), shown(report.text));
    span.style.background = colour(report.prob ?? 1);
    span.report = report;
    span.dataset.id = report.token;
    if (report.channel === "thought") this.thought.append(span);
    else if (report.channel === "tool_call") {
      if (!this.callBox) {
        this.callBox = el("div", "call callraw");
        this.body.append(this.callBox);
      }
      this.callBox.append(span);
    } else {
      this.callBox = null;
      this.body.append(span);
      this.text += delta.content || "";
    }
    this.msg.scrollIntoView({ block: "end" });
  }

  toolCalls(calls) {
    for (const call of calls) {
      this.calls.push(call);
      this.body.append(el("div", "call", `tool call: ${call.function.name}(${call.function.arguments})`));
    }
  }

  stats(usage, finish) {
    const kept = usage.x_drafted ? `guesses kept ${usage.x_kept}/${usage.x_drafted}` : "no drafting";
    const media = usage.x_media_tokens ? `, ${usage.x_media_tokens} of them image and audio` : "";
    const line = `${usage.completion_tokens} tokens, ${usage.x_generation_tps.toFixed(1)} tok/s, ${kept}; ` +
      `prompt ${usage.prompt_tokens} tokens (${usage.x_prompt_reused} reused, ${usage.x_prompt_processed} processed${media}); ` +
      `finish: ${finish}`;
    this.msg.append(el("div", "stats", line));
  }

  error(message) {
    this.msg.append(el("div", "error", message));
  }
}

// -- attachments: images and audio, sent as content parts -----------------------------------

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// The audio formats the server reads (WAV always; the others where it has soundfile), by the
// file's extension or, failing that, its type.
const AUDIO_FORMATS = { wav: "wav", "x-wav": "wav", wave: "wav", flac: "flac", ogg: "ogg", mp3: "mp3", mpeg: "mp3" };

function audioFormat(file) {
  const extension = (file.name.match(/\.(\w+)$/) || [])[1];
  const subtype = file.type.startsWith("audio/") ? file.type.slice(6) : undefined;
  return AUDIO_FORMATS[(extension || "").toLowerCase()] || AUDIO_FORMATS[subtype];
}

async function attach(files) {
  for (const file of files) {
    const format = file.type.startsWith("image/") ? undefined : audioFormat(file);
    const kind = file.type.startsWith("image/") ? "image" : format ? "audio" : null;
    if (!kind) continue;
    attached.push({ kind, format, name: file.name || kind, url: await readAsDataURL(file) });
  }
  showAttachments();
}

function mediaView(items) {
  const strip = el("div", "media");
  for (const item of items) {
    if (item.kind === "image") {
      const img = el("img", "thumb");
      img.src = item.url;
      img.alt = item.name;
      strip.append(img);
    } else {
      strip.append(el("span", "clip", "♪ " + item.name));
    }
  }
  return strip;
}

function showAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  attached.forEach((item, i) => {
    const wrap = el("div", "attachment");
    wrap.append(mediaView([item]));
    const remove = el("button", "", "×");
    remove.type = "button";
    remove.title = "Remove";
    remove.addEventListener("click", () => { attached.splice(i, 1); showAttachments(); });
    wrap.append(remove);
    box.append(wrap);
  });
  box.hidden = attached.length === 0;
}

function contentParts(text, items) {
  const parts = items.map((item) => item.kind === "image"
    ? { type: "image_url", image_url: { url: item.url } }
    : { type: "input_audio", input_audio: { data: item.url.split(",")[1], format: item.format } });
  return parts.concat([{ type: "text", text }]);
}

async function send(text, items) {
  const answer = new Answer();
  // The turn joins the conversation it began in only once answered (or stopped): a refused one
  // (an image a text-only model cannot read, a context too long) is shown, never sent again, and
  // "New chat" during the answer leaves the new conversation empty.
  const conversation = messages;
  const asked = { role: "user", content: items.length ? contentParts(text, items) : text };
  let failed = false;
  const request = {
    model, messages: conversation.concat([asked]), stream: true, stream_options: { include_usage: true }, x_report: true,
    mtp: $("mtp").checked ? undefined : false, thinking: $("thinking").checked,
    temperature: number("temperature"), top_k: number("top_k"), top_p: number("top_p"),
    max_tokens: number("max_tokens"),
  };
  controller = new AbortController();
  setBusy(true);
  let finish = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(request), signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || response.statusText);
    }
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) answer.stats(chunk.usage, finish);
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      for (const report of choice.x_tokens || []) answer.add(report, choice.delta || {});
      if (choice.delta && choice.delta.tool_calls) answer.toolCalls(choice.delta.tool_calls);
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  } catch (e) {
    failed = e.name !== "AbortError";
    answer.error(failed ? String(e.message || e) : "[stopped]");
  } finally {
    const reply = { role: "assistant", content: answer.text };
    if (answer.calls.length) reply.tool_calls = answer.calls.map(({ index, ...call }) => call);
    if (!failed) conversation.push(asked, reply);
    controller = null;
    setBusy(false);
  }
}

async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("prompt").disabled = busy;
  if (!busy) $("prompt").focus();
}

// -- a token's figures -------------------------------------------------------------------------

let active = null;

function showDetails(span) {
  const r = span.report;
  const box = $("details");
  box.replaceChildren();
  const title = el("div");
  title.append(el("span", "piece", shown(r.piece ?? r.text)), ` id ${r.token}`);
  box.append(title);
  const rows = [
    ["probability", pct(r.prob)], ["rank", r.rank ?? "–"], ["sampling probability", pct(r.sampling_prob)],
    ["candidates left", r.candidates ?? "–"], ["kept guess", r.drafted ? "yes" : "no"],
    ["channel", r.channel],
  ];
  const figures = el("table", "figures");
  for (const [name, value] of rows) {
    const tr = el("tr");
    tr.append(el("td", "", name), el("td", "p", String(value)));
    figures.append(tr);
  }
  box.append(figures, el("div", "muted", "top 5"));
  const top = el("table", "top5");
  for (const t of r.top || []) {
    const tr = el("tr");
    const piece = el("td");
    piece.append(el("span", "piece", shown(t.text ?? String(t.id))));
    tr.append(piece, el("td", "p", pct(t.prob)));
    top.append(tr);
  }
  box.append(top);
  box.hidden = false;
  const rect = span.getBoundingClientRect();
  const left = Math.min(rect.left, window.innerWidth - box.offsetWidth - 8);
  const below = rect.bottom + 6 + box.offsetHeight < window.innerHeight;
  box.style.left = Math.max(8, left) + "px";
  box.style.top = (below ? rect.bottom + 6 : Math.max(8, rect.top - box.offsetHeight - 6)) + "px";
  if (active) active.classList.remove("active");
  active = span;
  span.classList.add("active");
}

function hideDetails() {
  $("details").hidden = true;
  if (active) active.classList.remove("active");
  active = null;
}

$("log").addEventListener("mouseover", (e) => {
  if (e.target.classList.contains("tok") && e.target.report) showDetails(e.target);
});
$("log").addEventListener("mouseout", (e) => {
  if (e.target === active && e.pointerType !== "touch") hideDetails();
});
$("log").addEventListener("click", (e) => {  // a tap on a touch screen
  if (e.target.classList.contains("tok") && e.target.report) showDetails(e.target);
  else hideDetails();
});

// -- wiring ------------------------------------------------------------------------------------

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  const items = attached;
  attached = [];
  showAttachments();
  const shown = addMessage("user", text);
  if (items.length) shown.insertBefore(mediaView(items), shown.querySelector(".body"));
  send(text, items);
});
$("attach").addEventListener("change", (e) => { attach(Array.from(e.target.files)); e.target.value = ""; });
$("prompt").addEventListener("paste", (e) => {
  const files = Array.from(e.clipboardData.files || []);
  if (files.length) { e.preventDefault(); attach(files); }
});
$("composer").addEventListener("dragover", (e) => { e.preventDefault(); $("composer").classList.add("dropping"); });
$("composer").addEventListener("dragleave", () => $("composer").classList.remove("dropping"));
$("composer").addEventListener("drop", (e) => {
  e.preventDefault();
  $("composer").classList.remove("dropping");
  attach(Array.from(e.dataTransfer.files || []));
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("reset").addEventListener("click", () => {
  if (controller) controller.abort();  // (the answer's row ends on the server too)
  messages = [];
  $("log").replaceChildren();
  hideDetails();
});
$("settings").addEventListener("change", saveSettings);

async function start() {
  loadSettings();
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
    model = body.data[0].id;
    $("model").textContent = model.replace(/\/+$/, "").split("/").slice(-2).join("/");
    $("model").title = model;
  } catch (e) {
    $("model").textContent = "(" + (e.message || e) + "; set the API key and reload)";
  }
  $("prompt").focus();
}

start();
