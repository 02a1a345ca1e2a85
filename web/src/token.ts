// getToken is the one function a deployer replaces to supply the bearer token from their own sign-in (README
// "The web app": the OIDC variant with Cognito is shown there). As shipped it asks `agentloop dev` for a dev token
// (the dev server's /config.json names the URL; a deployment's never does, and its API never mints tokens), or
// uses a token given once in the page's URL (`#token=…`, kept in this tab's sessionStorage) to try the page
// against a deployed stack with a token from `agentloop token`.
import { appConfig } from './api';

let cached: { token: string; until: number } | undefined;

export async function getToken(): Promise<string> {
  const now = Date.now();
  if (cached && cached.until > now) return cached.token;
  const fromHash = new URLSearchParams(location.hash.replace(/^#/, '')).get('token');
  if (fromHash) {
    sessionStorage.setItem('agentloop.token', fromHash);
    history.replaceState(null, '', location.pathname + location.search);
  }
  const stored = sessionStorage.getItem('agentloop.token');
  if (stored) return stored;
  const { devTokenUrl } = await appConfig();
  if (!devTokenUrl) throw new Error('No sign-in is configured for this page.');
  const res = await fetch(devTokenUrl, { method: 'POST' });
  if (!res.ok) throw new Error('The dev server did not give a token.');
  const { token, expiresIn } = (await res.json()) as { token: string; expiresIn: number };
  cached = { token, until: now + Math.max(0, expiresIn - 60) * 1000 };
  return token;
}
