// Draws the pages' ```mermaid blocks (mkdocs.yml's superfences makes them <div class="mermaid">).
// Mermaid's own ES module, pinned, from its published npm package.
import mermaid from "https://cdn.jsdelivr.net/npm/mermaid@11.4.1/dist/mermaid.esm.min.mjs";

mermaid.initialize({ startOnLoad: true });
