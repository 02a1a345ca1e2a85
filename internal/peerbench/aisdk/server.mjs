// The AI SDK's own chat server, the peer of `agentloop dev` in the peer benchmark (internal/peerbench): a
// POST /chat route as the AI SDK's guides write it (streamText over the useChat body's messages, answered with
// toUIMessageStreamResponse), served by node:http, the lightest host a route handler can have. The model is
// @ai-sdk/openai's Chat Completions model (openai.chat: openai(id) would use the Responses API) against the
// benchmark's fake OpenAI-compatible endpoint. Nothing is stored: this is the stateless server agentloop is
// compared with.
//
//   node server.mjs PORT OPENAI_BASE_URL MODEL
//
// It prints "listening on http://127.0.0.1:PORT" once serving.
import http from 'node:http';
import { once } from 'node:events';
import { convertToModelMessages, streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const [port, baseURL, modelId] = process.argv.slice(2);
if (!port || !baseURL || !modelId) {
	console.error('usage: node server.mjs PORT OPENAI_BASE_URL MODEL');
	process.exit(2);
}
const openai = createOpenAI({ baseURL, apiKey: 'peerbench' });

async function readJSON(req) {
	const chunks = [];
	for await (const chunk of req) chunks.push(chunk);
	return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

// send writes a web Response to a node:http response, as a Node host of a route handler does (with backpressure).
async function send(res, response) {
	res.writeHead(response.status, Object.fromEntries(response.headers));
	if (response.body) {
		for await (const chunk of response.body) {
			if (res.destroyed) break; // the client went away
			if (!res.write(chunk)) await Promise.race([once(res, 'drain'), once(res, 'close')]);
		}
	}
	res.end();
}

async function chat(req, res) {
	const { messages } = await readJSON(req);
	const result = streamText({
		model: openai.chat(modelId),
		messages: await convertToModelMessages(messages),
	});
	await send(res, result.toUIMessageStreamResponse());
}

const server = http.createServer((req, res) => {
	if (req.method === 'POST' && req.url === '/chat') {
		chat(req, res).catch((err) => {
			console.error('chat:', err);
			if (!res.headersSent) res.writeHead(500, { 'Content-Type': 'application/json' });
			res.end();
		});
		return;
	}
	res.writeHead(404);
	res.end();
});
server.listen(Number(port), '127.0.0.1', () => console.log(`listening on http://127.0.0.1:${port}`));
