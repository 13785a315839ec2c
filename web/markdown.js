// A small Markdown renderer for model output that builds DOM nodes and text nodes only:
// nothing the model writes is ever parsed as HTML, so "<script>" stays text. Covers fenced
// code blocks, headings, lists, block quotes, paragraphs, and inline code, bold, italic
// and links (http, https and mailto only).
import { el } from "./common.js";

const SAFE_URL = /^(https?:|mailto:)/i;

// Inline spans: `code`, **bold**, *italic* / _italic_, [text](url).
function inline(text) {
  const out = [];
  const pattern = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*\n]+)\*\*|__([^_\n]+)__|\*([^*\s][^*\n]*)\*|\[([^\]\n]+)\]\(([^)\s]+)\)/g;
  let last = 0;
  for (let m; (m = pattern.exec(text)); ) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[2] !== undefined) out.push(el("code", {}, m[2]));
    else if (m[3] !== undefined) out.push(el("strong", {}, ...inline(m[3])));
    else if (m[4] !== undefined) out.push(el("strong", {}, ...inline(m[4])));
    else if (m[5] !== undefined) out.push(el("em", {}, ...inline(m[5])));
    else if (m[6] !== undefined) {
      const url = m[7];
      if (SAFE_URL.test(url)) out.push(el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, m[6]));
      else out.push(m[0]);
    }
    last = pattern.lastIndex;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

function codeBlock(lang, lines) {
  const code = el("code", lang ? { "data-lang": lang } : {}, lines.join("\n"));
  const copy = el("button", { type: "button", class: "copy", title: "Copy the code" }, "Copy");
  copy.addEventListener("click", () => {
    navigator.clipboard?.writeText(code.textContent).then(
      () => (copy.textContent = "Copied"),
      () => (copy.textContent = "Copy failed"),
    );
  });
  return el("div", { class: "code-block" }, el("div", { class: "code-head" }, lang || "code", copy), el("pre", {}, code));
}

// Renders `text` into a DocumentFragment.
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) fragment.append(el("p", {}, ...inline(paragraph.join("\n"))));
    paragraph = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/.exec(line);
    if (fence) {
      flush();
      const body = [];
      ++i;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      ++i; // the closing fence (or the end of a block still streaming)
      fragment.append(codeBlock(fence[2], body));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      flush();
      fragment.append(el(`h${Math.min(heading[1].length + 2, 6)}`, {}, ...inline(heading[2])));
      ++i;
      continue;
    }
    if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
      flush();
      const ordered = /^\s*\d+[.)]\s+/.test(line);
      const list = el(ordered ? "ol" : "ul");
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        list.append(el("li", {}, ...inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ""))));
        ++i;
      }
      fragment.append(list);
      continue;
    }
    if (/^>\s?/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^>\s?/.test(lines[i])) quoted.push(lines[i++].replace(/^>\s?/, ""));
      const quote = el("blockquote");
      quote.append(renderMarkdown(quoted.join("\n")));
      fragment.append(quote);
      continue;
    }
    if (/^\s*$/.test(line)) {
      flush();
      ++i;
      continue;
    }
    paragraph.push(line);
    ++i;
  }
  flush();
  return fragment;
}
