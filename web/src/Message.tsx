import type { UIMessage } from 'ai';
import { useState } from 'react';
import { defaultRehypePlugins, Streamdown } from 'streamdown';
import type { Job } from './api';
import { UsageLine } from './Chat';

type Props = {
  message: UIMessage;
  jobs: Map<string, Job>;
  canRegenerate: boolean;
  canEdit: boolean;
  onRegenerate: () => void;
  onEdit: (text: string) => void;
  onApprove: (approvalId: string, approved: boolean, reason?: string) => void;
  onAnswer: (toolCallId: string, answer: string) => void;
};

type AnyPart = Record<string, any> & { type: string };

export function MessageView(props: Props) {
  const { message } = props;
  const meta = (message.metadata ?? {}) as Record<string, any>;
  // A job's result arrives as a user-role steer message: it is a result, never something the user said.
  if (meta.subagentResult) return <SteerResult message={message} />;
  return message.role === 'user' ? <UserMessage {...props} /> : <AssistantMessage {...props} />;
}

function textOf(m: UIMessage): string {
  return (m.parts as AnyPart[])
    .filter((p) => p.type === 'text')
    .map((p) => p.text as string)
    .join('\n');
}

function UserMessage({ message, canEdit, onEdit }: Props) {
  const [editing, setEditing] = useState(false);
  const [draft, setDraft] = useState('');
  const parts = message.parts as AnyPart[];
  return (
    <article className="msg user" aria-label="You">
      {editing ? (
        <form
          className="edit"
          onSubmit={(e) => {
            e.preventDefault();
            setEditing(false);
            if (draft.trim()) onEdit(draft);
          }}
        >
          <label>
            <span className="visually-hidden">Edited message</span>
            <textarea value={draft} autoFocus onChange={(e) => setDraft(e.target.value)} rows={3} />
          </label>
          <button type="submit">Save and send</button>
          <button type="button" onClick={() => setEditing(false)}>
            Cancel
          </button>
        </form>
      ) : (
        <>
          {parts.map((p, i) =>
            p.type === 'text' ? (
              <p key={i} className="text">
                {p.text}
              </p>
            ) : p.type === 'file' ? (
              <FileChip key={i} part={p} />
            ) : null,
          )}
          {canEdit && (
            <button
              type="button"
              className="small"
              onClick={() => {
                setDraft(textOf(message));
                setEditing(true);
              }}
            >
              Edit
            </button>
          )}
        </>
      )}
    </article>
  );
}

function FileChip({ part }: { part: AnyPart }) {
  const name = part.filename || part.mediaType;
  if (String(part.mediaType).startsWith('image/') && String(part.url).startsWith('data:')) {
    return <img className="thumb" src={part.url} alt={name} />;
  }
  return <span className="file">📎 {name}</span>;
}

function AssistantMessage(props: Props) {
  const { message, canRegenerate, onRegenerate } = props;
  const meta = (message.metadata ?? {}) as Record<string, any>;
  const parts = message.parts as AnyPart[];
  return (
    <article className="msg assistant" aria-label="Assistant">
      {parts.map((p, i) => (
        <PartView key={i} part={p} {...props} />
      ))}
      {meta.error && !parts.some((p) => p.type === 'data-run-error') && <RunError error={meta.error} />}
      {meta.status === 'canceled' && <p className="muted">Stopped.</p>}
      <footer>
        <UsageLine usage={meta.usage} label="Usage" />
        {canRegenerate && (
          <button type="button" className="small" onClick={onRegenerate}>
            Regenerate
          </button>
        )}
      </footer>
    </article>
  );
}

// Markdown from the model, rendered as it streams. Raw HTML in it is dropped, never parsed: streamdown's default
// plugins minus rehype-raw, with skipHtml; link and image URLs go through its sanitizer and hardening; links are
// plain links (no confirmation dialog).
const rehypePlugins = [defaultRehypePlugins.sanitize, defaultRehypePlugins.harden];

function Markdown({ text }: { text: string }) {
  return (
    <div className="md">
      <Streamdown skipHtml rehypePlugins={rehypePlugins} linkSafety={{ enabled: false }}>
        {text}
      </Streamdown>
    </div>
  );
}

function PartView({ part, jobs, onApprove, onAnswer }: Props & { part: AnyPart }) {
  if (part.type === 'text') {
    return <Markdown text={part.text ?? ''} />;
  }
  if (part.type === 'reasoning') {
    return (
      <details className="reasoning">
        <summary>Reasoning</summary>
        <p>{part.text}</p>
      </details>
    );
  }
  if (part.type === 'data-subagent-artifact') return <ArtifactCard data={part.data} />;
  // A failed reply's error, in the reply where it happened (stored and streamed alike: README "Architecture").
  if (part.type === 'data-run-error') return <RunError error={part.data} />;
  if (part.type.startsWith('tool-') || part.type === 'dynamic-tool') {
    const name = part.type === 'dynamic-tool' ? part.toolName : part.type.slice(5);
    const job = jobs.get(part.toolCallId);
    return (
      <>
        <ToolCard name={name} part={part} />
        {part.state === 'approval-requested' && part.approval && (
          <ApprovalCard name={name} input={part.input} onDecide={(ok, reason) => onApprove(part.approval.id, ok, reason)} />
        )}
        {name === 'ask_user_question' && part.state === 'input-available' && (
          <QuestionForm input={part.input} onAnswer={(a) => onAnswer(part.toolCallId, a)} />
        )}
        {job && <JobCard job={job} />}
      </>
    );
  }
  return null;
}

function RunError({ error }: { error: any }) {
  return (
    <p className="error-line" role="note">
      The reply failed: {String(error?.message || error?.code || 'unknown error')}
    </p>
  );
}

const stateWords: Record<string, string> = {
  'input-streaming': 'preparing',
  'input-available': 'running',
  'approval-requested': 'waiting for approval',
  'approval-responded': 'answered',
  'output-available': 'done',
  'output-error': 'failed',
  'output-denied': 'denied',
};

function ToolCard({ name, part }: { name: string; part: AnyPart }) {
  return (
    <div className={`tool ${part.state}`}>
      <details>
        <summary>
          Tool {name}: {stateWords[part.state] ?? part.state}
        </summary>
        <h3>Input</h3>
        <pre>{JSON.stringify(part.input, null, 2)}</pre>
        {part.output !== undefined && (
          <>
            <h3>Output</h3>
            <pre>{JSON.stringify(part.output, null, 2)}</pre>
          </>
        )}
      </details>
      {part.state === 'output-error' && <p className="error-line">{part.errorText}</p>}
    </div>
  );
}

function ApprovalCard({ name, input, onDecide }: { name: string; input: unknown; onDecide: (ok: boolean, reason?: string) => void }) {
  const [reason, setReason] = useState('');
  const [sent, setSent] = useState(false);
  const decide = (ok: boolean) => {
    setSent(true);
    onDecide(ok, reason.trim() || undefined);
  };
  return (
    <div className="approval" role="group" aria-label={`Approve ${name}?`}>
      <p>
        The assistant wants to run <strong>{name}</strong> with <code>{JSON.stringify(input)}</code>.
      </p>
      <label>
        Reason (optional)
        <input value={reason} onChange={(e) => setReason(e.target.value)} disabled={sent} />
      </label>
      <button type="button" onClick={() => decide(true)} disabled={sent}>
        Approve
      </button>
      <button type="button" onClick={() => decide(false)} disabled={sent}>
        Deny
      </button>
    </div>
  );
}

function QuestionForm({ input, onAnswer }: { input: any; onAnswer: (answer: string) => void }) {
  const [sent, setSent] = useState(false);
  const options: string[] = Array.isArray(input?.options) ? input.options.map(String) : [];
  return (
    <div className="question" role="group" aria-label={String(input?.question ?? 'Question')}>
      <p>{String(input?.question ?? '')}</p>
      {options.map((o) => (
        <button
          key={o}
          type="button"
          disabled={sent}
          onClick={() => {
            setSent(true);
            onAnswer(o);
          }}
        >
          {o}
        </button>
      ))}
    </div>
  );
}

function JobCard({ job }: { job: Job }) {
  const running = job.status === 'running' || job.status === 'pending' || job.status === 'dispatched';
  return (
    <section className="job" aria-label={`Job: ${job.kind}`}>
      <p className="job-status">
        {running ? 'Working' : job.status === 'done' ? 'Finished' : job.status === 'error' ? 'Failed' : job.status}
        {running && job.activity ? `: ${job.activity}` : ''}
      </p>
      {!running && job.error && <p className="error-line">{job.error.message || job.error.code}</p>}
      {!running && job.status === 'done' && <p className="muted">The result is below, once delivered.</p>}
    </section>
  );
}

function SteerResult({ message }: { message: UIMessage }) {
  const artifact = (message.parts as AnyPart[]).find((p) => p.type === 'data-subagent-artifact');
  return (
    <aside className="steer" aria-label="Job result">
      {artifact ? <ArtifactCard data={artifact.data} /> : <p>A job reported back.</p>}
    </aside>
  );
}

function ArtifactCard({ data }: { data: any }) {
  return (
    <div className="artifact">
      <p className="artifact-head">Result of the {String(data?.kind ?? 'job')} job</p>
      {data?.error ? <p className="error-line">{String(data.error?.message ?? data.error)}</p> : <ArtifactBody result={data?.result} />}
    </div>
  );
}

function ArtifactBody({ result }: { result: any }) {
  if (result == null) return null;
  const sources: any[] = Array.isArray(result.sources) ? result.sources : [];
  return (
    <div className="artifact-body">
      {result.brief ? (
        <Markdown text={String(result.brief)} />
      ) : (
        <pre>{JSON.stringify(result, null, 2)}</pre>
      )}
      {sources.length > 0 && (
        <ul className="sources">
          {sources.map((s, i) => (
            <li key={i}>
              {String(s.url ?? '').startsWith('https://') ? (
                <a href={s.url} target="_blank" rel="noreferrer noopener">
                  {s.title || s.url}
                </a>
              ) : (
                String(s.title ?? s.url ?? '')
              )}
            </li>
          ))}
        </ul>
      )}
    </div>
  );
}
