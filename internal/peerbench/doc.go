// Package peerbench is the peer benchmark of issue 18 (make bench-peer, part of make bench; never part of make
// test: TestPeerBench skips unless PEERBENCH=1): `agentloop dev` and the AI SDK's own chat server side by side,
// driven by one load client against one fake model, one run per load, and one table printed at the end.
//
// # The servers
//
//   - agentloop: this tree's cmd/agentloop, built by the test (go build), `agentloop dev` on a fresh data
//     directory (SQLite), OPENAI_API_KEY, OPENAI_BASE_URL and AGENT_MODEL pointing it at the fake model (the
//     Chat Completions adapter), and every per-user limit off (AGENT_MAX_ACTIVE_RUNS_PER_USER,
//     AGENT_THREADS_PER_MINUTE, AGENT_MAX_STREAMS_PER_USER, AGENT_MAX_STREAMS_PER_RUN, AGENT_MAX_ACTIVE_JOBS_PER_USER
//     = 0); the load user is the dev token's. Its default settings otherwise (log level info, to a file).
//   - aisdk: aisdk/server.mjs, a node:http POST /chat route with streamText over the body's messages and
//     toUIMessageStreamResponse, @ai-sdk/openai's Chat Completions model (openai.chat) against the same fake; ai
//     and @ai-sdk/openai pinned in aisdk/package.json and package-lock.json (installed by make bench-peer with
//     npm ci), on the machine's Node (NODE overrides it; the pinned ai@6 supports Node 18 and later). It stores
//     nothing.
//
// Each server is started afresh for each load (so peak RSS is that load's) and stopped after it. Two streams
// warm it up before the load (not measured: V8 compiles the route's code on its first requests).
//
// # The fake model
//
// An OpenAI-compatible POST …/chat/completions endpoint in the test process (anything else is a 404, so a client
// that speaks the Responses API fails loudly): every request streams 200 words, one every 5 ms, then
// finish_reason stop, a usage chunk when stream_options asks for one, and [DONE]. The pace is open loop, as a
// remote model's: word i is due 5 ms × (i+1) after the request, however slowly the server reads; a fake that
// falls behind (the test process short of CPU) sends the overdue words in one write, and the table counts its
// writes more than 10 ms late. Each word is "w" and its send time in microseconds since the benchmark's epoch,
// base 36, followed by a space: the client reads the send time out of the text it receives.
//
// # The load client
//
// N concurrent streams, each a thread of its own (POST /chat with the body useChat's DefaultChatTransport sends:
// {id, messages, trigger: submit-message}, the whole history, the newest a new user message), released at once;
// a load of R rounds sends R messages in each thread, one after the other (the next round starts when every
// stream of the last one has ended). The client reads the UI message stream (SSE), splits text-delta deltas into
// words and measures, for each word, receipt − send (the model→client latency: the server's and the client's
// scheduling, both on the same 2 cores). A stream is an error when its answer is not 200, it carries an error
// chunk, it ends without finish and [DONE], or it delivers other than 200 words.
//
// # What it prints, per server and load
//
//   - CPU per streamed word: the server process's user+sys CPU (/proc/<pid>/stat, clock ticks of 10 ms) from
//     before the first request to the end of the last stream, ÷ the words the client received;
//   - model→client latency p50 and p99 over every word, and POST → first word p50 and p99 over the streams (what
//     the model→client latency leaves out: how long a request waits before the server calls the model);
//   - peak RSS: VmHWM of /proc/<pid>/status at the end of the load;
//   - errors, by kind;
//   - agentloop only: the stored runs' outcomes (GET /threads/{id}/runs once every run has ended, at most a
//     minute), and the store statements the runs recorded (each run's `store.requests`: every SQLite
//     statement made under the run's context, heartbeats, stop polls and segment flushes included, the finish
//     write and what follows it not) per second of the load's streaming and per run per second; and the
//     statements the whole process made ("process", from the "store totals" line `agentloop dev` logs at exit:
//     what the runs' counts leave out, such as work done once per process for all its runs, the warm-up and
//     the outcome reads included) per second of the load's streaming;
//   - the ratio agentloop / AI SDK of CPU per word.
//
// The fake model and the client run in the test process on the same cores as the server measured: their CPU
// is not counted, but it competes.
//
// # Settings
//
//	PEERBENCH=1          run (make bench-peer sets it)
//	PEERBENCH_LOADS      loads to run, e.g. "20x3,200,1000" (the default); NxR is N streams × R rounds
//	PEERBENCH_SERVERS    agentloop,aisdk (the default) or one of them
//	NODE                 the node binary for the AI SDK server (default: node on PATH)
package peerbench
