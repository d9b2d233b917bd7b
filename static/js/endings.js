// What the answer's bubble says before its first word and after its last one. Listens to the
// frames chat.js announces ("sluice:frame"):
// - start: the model is reading the prompt ("Reading your question (N tokens)…") until the
//   first word arrives (chat.js clears the status line then);
// - final: an answer cut by the length cap or stopped because it looped says so and offers
//   Continue (a new request that goes on from there, sent through window.sluiceChat);
//   the sources under it are only those the answer used.
// Text only ever goes in with textContent.
(function () {
  "use strict";
  const list = document.getElementById("message-list");
  if (!list) return;
  const cited = {}; // request id -> the citations its status frames carried

  const ENDINGS = {
    length: "The answer reached its length limit (answers are shorter while Sluice is busy).",
    loop: "The answer was stopped because it kept repeating itself.",
  };

  function bubble(requestId) {
    return list.querySelector('li.message.assistant[data-request-id="' + CSS.escape(requestId) + '"]');
  }

  // The same rule as apps/rag/prompting.py citations_used: the passages cited by number, or,
  // when the answer cites none by number, those sharing at least three of their terms.
  const TERM = /[^\W\d_]{5,}/gu;
  function used(citations, answer) {
    const numbers = new Set();
    for (const m of answer.matchAll(/\[(\d{1,3})\]/g)) numbers.add(Number(m[1]));
    if (citations.some(function (c) { return numbers.has(c.number); })) {
      return citations.filter(function (c) { return numbers.has(c.number); });
    }
    const words = new Set((answer.match(TERM) || []).map(function (w) { return w.toLowerCase(); }));
    return citations.filter(function (c) {
      return (c.terms || []).filter(function (t) { return words.has(t); }).length >= 3;
    });
  }

  function keepUsedSources(li, frame) {
    const aside = li.querySelector("aside.citations");
    const citations = cited[frame.request_id];
    if (!aside || !citations) return;
    const keep = new Set(used(citations, frame.text || "").map(function (c) { return c.number; }));
    const items = aside.querySelectorAll("li");
    citations.forEach(function (c, i) {
      if (items[i] && !keep.has(c.number)) items[i].remove();
    });
    if (!aside.querySelector("li")) aside.remove();
  }

  function offerContinue(li, reason) {
    const note = document.createElement("p");
    note.className = "answer-ending muted";
    note.textContent = ENDINGS[reason] + " ";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "continue-button";
    button.textContent = "Continue";
    note.appendChild(button);
    const aside = li.querySelector("aside.citations");
    li.insertBefore(note, aside || null);
  }

  // One listener for every Continue: the ones offered live and the one a reloaded page shows
  // under its latest answer (templates/chat/_ending.html).
  list.addEventListener("click", function (event) {
    if (!event.target.closest(".continue-button")) return;
    if (window.sluiceChat && window.sluiceChat.send({ type: "continue" })) {
      document.querySelectorAll(".continue-button").forEach(function (b) { b.remove(); });
    }
  });

  document.addEventListener("sluice:frame", function (event) {
    const frame = event.detail || {};
    if (frame.type === "status" && frame.citations) cited[frame.request_id] = frame.citations;
    if (frame.type === "start" && frame.prompt_tokens > 0) {
      const li = bubble(frame.request_id);
      const status = li && li.querySelector(".status");
      if (status && !li.querySelector(".text").textContent) {
        status.textContent = "Reading your question (" + frame.prompt_tokens + " tokens)…";
      }
    }
    if (frame.type === "final") {
      const li = bubble(frame.request_id);
      if (!li) return;
      keepUsedSources(li, frame);
      if (frame.state === "done" && ENDINGS[frame.finish_reason]) offerContinue(li, frame.finish_reason);
      delete cited[frame.request_id];
    }
    // Any new request: an older answer's Continue is no longer the latest.
    if (frame.type === "request") {
      document.querySelectorAll(".continue-button").forEach(function (b) { b.remove(); });
    }
  });
})();
