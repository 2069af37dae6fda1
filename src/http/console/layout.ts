/** The console's page frame, its small pieces (states, pagers, notices, forms) and its charts. */
import { escapeHtml, Html, markup, type HtmlValue } from './html.ts';

export const NAV = [
  { path: '/console', label: 'Overview' },
  { path: '/console/actors', label: 'Actors' },
  { path: '/console/dead-letters', label: 'Dead letters' },
  { path: '/console/outbox', label: 'Outbox' },
  { path: '/console/workers', label: 'Workers' },
] as const;

/** Who is signed in, for the frame and every form. */
export interface Viewer {
  tokenName: string;
  /** The CSRF token forms carry (S2 of src/ops/console-sessions.ts); '' for a bearer caller. */
  csrf: string;
}

export function page(opts: {
  title: string;
  here: string;
  viewer: Viewer | undefined;
  notice?: string | undefined;
  body: HtmlValue;
}): Html {
  return markup`<!doctype html>
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="viewport" content="width=device-width, initial-scale=1" />
        <title>${opts.title} · corral console</title>
        <link rel="stylesheet" href="/console/assets/console.css" />
        <link rel="icon" href="/console/assets/icon.svg" />
        <script src="/console/assets/console.js" defer></script>
      </head>
      <body>
        <header>
          <span class="brand">corral console</span>
          ${
            opts.viewer
              ? markup`<nav>
                    ${NAV.map((n) => markup`<a href="${n.path}" ${n.path === opts.here ? markup` class="here"` : ''}>${n.label}</a>`)}
                  </nav>
                  <span class="who"
                    >signed in with <code id="who">${opts.viewer.tokenName}</code>${
                      opts.viewer.csrf
                        ? markup`${csrfForm('/console/sign-out', opts.viewer)}<button class="quiet" id="sign-out">Sign out</button></form>`
                        : ''
                    }</span
                  >`
              : ''
          }
        </header>
        <main>${opts.notice ? markup`<div class="notice" id="notice">${opts.notice}</div>` : ''} ${opts.body}</main>
      </body>
    </html>`;
}

/** The opening of a POST form to `action` carrying the CSRF token; the caller closes it. */
export function csrfForm(action: string, viewer: Viewer, attrs: { confirm?: string; cls?: string; id?: string } = {}): Html {
  // an open tag: built as text (escaped here), so that no formatter closes it
  const attr = (name: string, value: string | undefined) => (value === undefined ? '' : ` ${name}="${escapeHtml(value)}"`);
  return Html.of(
    `<form method="post"${attr('action', action)}${attr('class', attrs.cls ?? 'inline')}${attr('id', attrs.id)}${attr('data-confirm', attrs.confirm)}>` +
      `<input type="hidden" name="_csrf"${attr('value', viewer.csrf)}>`,
  );
}

export const stateBadge = (state: string): Html => markup`<span class="state state-${state}">${state.replace('_', '-')}</span>`;

/** "Next page" when there is one. */
export function pager(next: string | undefined, first: string | undefined): Html {
  return markup`<div class="pager">
    ${first ? markup`<a href="${first}">First page</a>` : ''}${
      next ? markup`<a href="${next}" id="next-page">Next page</a>` : markup`<span class="muted">Last page</span>`
    }
  </div>`;
}

/** A bar chart of `values` (one bar each, oldest first) as inline SVG: no script, no style attribute. */
export function barChart(values: readonly number[], label: string): Html {
  const w = 300;
  const h = 60;
  const max = Math.max(1, ...values);
  const bw = w / Math.max(1, values.length);
  const bars = values.map((v, i) => {
    const bh = v <= 0 ? 0 : Math.max(1, (v / max) * (h - 2));
    return markup`<rect
      x="${(i * bw).toFixed(1)}"
      y="${(h - bh).toFixed(1)}"
      width="${Math.max(1, bw - 1).toFixed(1)}"
      height="${bh.toFixed(1)}"
      fill="#2456c7"
    ></rect>`;
  });
  return markup`<svg viewBox="0 0 ${w} ${h}" preserveAspectRatio="none" role="img" aria-label="${label}">
    <rect x="0" y="0" width="${w}" height="${h}" fill="#f6f7f9"></rect>
    ${bars}
  </svg>`;
}
