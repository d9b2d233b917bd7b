// Conversation memory on the page: Pin / Unpin a message without a reload (the form posts
// without JavaScript). A pinned message stays in the model's prompt however long the chat
// grows; the "what I remember" note above the messages is rendered by the server.
(function () {
  "use strict";
  const list = document.getElementById("message-list");
  if (!list || !window.fetch) return;

  function csrfToken(form) {
    const input = form.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function show(form, pinned) {
    const button = form.querySelector(".pin-button");
    const input = form.querySelector("input[name=pinned]");
    button.textContent = pinned ? "Unpin" : "Pin";
    button.setAttribute("aria-pressed", pinned ? "true" : "false");
    input.value = pinned ? "0" : "1";
    const li = form.closest("li.message");
    if (li) li.classList.toggle("pinned", pinned);
  }

  list.addEventListener("submit", function (event) {
    const form = event.target.closest("form.pin-form");
    if (!form) return;
    event.preventDefault();
    const body = new FormData(form);
    fetch(form.action, {
      method: "POST",
      body: body,
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": csrfToken(form) },
    })
      .then(function (response) {
        if (!response.ok) throw new Error(String(response.status));
        return response.json();
      })
      .then(function (data) { show(form, Boolean(data.pinned)); })
      .catch(function () { form.submit(); }); // let the server answer with a page
  });

  list.querySelectorAll("form.pin-form").forEach(function (form) {
    show(form, form.querySelector("input[name=pinned]").value === "0");
  });
})();
