// The public Sandbox class and its default runtime are defined in airlock.ts (beside the runtime
// that makes them); named re-exports here for the callers that import the sandbox layer by folder.
export { Sandbox, defaultAirlock } from './airlock.js';
