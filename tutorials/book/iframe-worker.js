/* The book's search from disk. Material runs its search in a Web Worker, and Chromium refuses
   `new Worker(url)` on a file:// page. Opened from disk, this replaces Worker: the worker's script runs
   in a hidden iframe of the page (about:blank, so the page can reach into it), the iframe's global
   `postMessage` hands messages back to the page, and the page's `postMessage` fires the iframe's
   `message` listeners; messages sent before the script has loaded wait for it. importScripts is not
   provided: Material's worker calls it only for languages other than English.
   (The name matters: Material's offline plugin adds a shim from the network unless a polyfill named
   like this one is listed.) */
(function () {
  if (location.protocol !== "file:") return;
  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.waiting = [];
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      document.body.appendChild(this.frame);
      const inside = this.frame.contentWindow;
      inside.postMessage = data => this.dispatchEvent(new MessageEvent("message", { data }));
      inside.importScripts = () => { throw new Error("importScripts is not available to a worker run from disk"); };
      const script = inside.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => { const waiting = this.waiting; this.waiting = null; waiting.forEach(data => this.postMessage(data)); };
      script.onerror = () => this.dispatchEvent(new Event("error"));
      inside.document.head.appendChild(script);
    }
    postMessage(data) {
      if (this.waiting) { this.waiting.push(data); return; }
      const inside = this.frame.contentWindow;
      inside.dispatchEvent(new inside.MessageEvent("message", { data }));
    }
    terminate() { this.frame.remove(); }
  }
  window.Worker = FileWorker;
})();
