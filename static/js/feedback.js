// Thumbs up/down on answers (templates/chat/_feedback.html): posted to the REST API without a
// reload. One click sets or changes the vote, a click on the pressed thumb takes it back; a
// down-vote opens the optional reasons and comment. Answers that arrive live get their thumbs
// when they end (chat.js drops their "pending" class then).
(function () {
  "use strict";
  const list = document.getElementById("message-list");
  const template = document.getElementById("feedback-template");
  if (!list) return;

  function csrf(form) {
    const input = form.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function show(form, vote) {
    form.querySelectorAll(".feedback-vote").forEach(function (button) {
      button.setAttribute("aria-pressed", String(button.value === vote));
    });
    form.querySelector(".feedback-details").hidden = vote !== "down";
  }

  function send(form, body) {
    const status = form.querySelector(".feedback-status");
    status.textContent = "";
    return fetch(form.action, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf(form) },
      body: JSON.stringify(body),
    }).then(function (response) {
      if (response.status === 404) throw new Error("This answer can no longer be rated.");
      return response.json().then(function (data) {
        if (!response.ok) throw new Error(data.error || "The vote was not saved.");
        return data;
      });
    }).then(function (data) {
      show(form, data.vote || "");
      status.textContent = data.vote ? "Thanks." : "Vote taken back.";
    }).catch(function (error) {
      status.textContent = error.message;
    });
  }

  list.addEventListener("submit", function (event) {
    const form = event.target.closest("form.feedback");
    if (!form) return;
    event.preventDefault();
    const button = event.submitter;
    if (!button) return;
    if (button.classList.contains("feedback-send")) {
      const reasons = Array.from(form.querySelectorAll("input[name=reasons]:checked"))
        .map(function (box) { return box.value; });
      send(form, { vote: "down", reasons: reasons, comment: form.querySelector("textarea").value });
      return;
    }
    const pressed = button.getAttribute("aria-pressed") === "true";
    send(form, { vote: pressed ? null : button.value });
  });

  function addThumbs() {
    if (!template) return;
    list.querySelectorAll("li.message.assistant[data-request-id]:not(.pending)").forEach(function (li) {
      if (li.querySelector("form.feedback")) return;
      const id = li.dataset.requestId;
      const form = template.content.firstElementChild.cloneNode(true);
      form.action = form.getAttribute("action").replace("__ID__", encodeURIComponent(id));
      li.appendChild(form);
    });
  }
  new MutationObserver(addThumbs).observe(list, {
    subtree: true, childList: true, attributes: true, attributeFilter: ["class"],
  });
})();
