import type { FileUIPart } from 'ai';
import { useRef, useState } from 'react';
import { config } from './api';

// What the server accepts in a user message (README "What a client may send"): images and PDFs, the whole
// message at most AGENT_MAX_MESSAGE_BYTES of JSON (files travel base64, 4/3 of their size).
const accepted = ['image/png', 'image/jpeg', 'image/gif', 'image/webp', 'application/pdf'];
const defaultMaxMessageBytes = 2 * 1024 * 1024;

type Props = { busy: boolean; onSend: (text: string, files: FileUIPart[]) => Promise<void> | void; onStop: () => void };

export function Composer({ busy, onSend, onStop }: Props) {
  const [text, setText] = useState('');
  const [files, setFiles] = useState<FileUIPart[]>([]);
  const [refused, setRefused] = useState('');
  const [dragging, setDragging] = useState(false);
  const picker = useRef<HTMLInputElement>(null);
  const box = useRef<HTMLTextAreaElement>(null);

  const add = async (list: FileList | File[]) => {
    const max = config().maxMessageBytes || defaultMaxMessageBytes;
    const notes: string[] = [];
    const next = [...files];
    let bytes = next.reduce((n, f) => n + f.url.length, 0);
    for (const f of Array.from(list)) {
      if (!accepted.includes(f.type)) {
        notes.push(`${f.name} can't be attached: only images (PNG, JPEG, GIF, WebP) and PDFs are accepted.`);
        continue;
      }
      const url = await dataURL(f);
      if (bytes + url.length > max - 64 * 1024) {
        notes.push(`${f.name} can't be attached: a message holds at most about ${Math.floor((max * 3) / 4 / 1024 / 1024 * 10) / 10} MB of files.`);
        continue;
      }
      bytes += url.length;
      next.push({ type: 'file', mediaType: f.type, filename: f.name, url });
    }
    setFiles(next);
    setRefused(notes.join(' '));
  };

  const submit = async () => {
    const t = text.trim();
    if (!t && files.length === 0) return;
    const sent = files;
    setText('');
    setFiles([]);
    setRefused('');
    await onSend(t, sent);
    box.current?.focus();
  };

  return (
    <form
      className={`composer${dragging ? ' dragging' : ''}`}
      onSubmit={(e) => {
        e.preventDefault();
        void submit();
      }}
      onDragOver={(e) => {
        e.preventDefault();
        setDragging(true);
      }}
      onDragLeave={() => setDragging(false)}
      onDrop={(e) => {
        e.preventDefault();
        setDragging(false);
        void add(e.dataTransfer.files);
      }}
    >
      {files.length > 0 && (
        <ul className="attachments" aria-label="Attachments">
          {files.map((f, i) => (
            <li key={i}>
              {f.filename}
              <button type="button" aria-label={`Remove ${f.filename}`} onClick={() => setFiles(files.filter((_, j) => j !== i))}>
                ×
              </button>
            </li>
          ))}
        </ul>
      )}
      {refused && (
        <p role="status" className="error-line">
          {refused}
        </p>
      )}
      <textarea
        ref={box}
        aria-label="Message"
        placeholder={busy ? 'A reply is running: your message will wait its turn' : 'Message'}
        value={text}
        rows={2}
        onChange={(e) => setText(e.target.value)}
        onKeyDown={(e) => {
          if (e.key === 'Enter' && !e.shiftKey && !e.nativeEvent.isComposing) {
            e.preventDefault();
            void submit();
          }
        }}
      />
      <input
        ref={picker}
        type="file"
        multiple
        hidden
        accept={accepted.join(',')}
        onChange={(e) => {
          if (e.target.files) void add(e.target.files);
          e.target.value = '';
        }}
      />
      <div className="buttons">
        <button type="button" onClick={() => picker.current?.click()}>
          Attach
        </button>
        {busy && (
          <button type="button" onClick={onStop}>
            Stop
          </button>
        )}
        <button type="submit">Send</button>
      </div>
    </form>
  );
}

function dataURL(f: File): Promise<string> {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result));
    r.onerror = () => reject(r.error);
    r.readAsDataURL(f);
  });
}
