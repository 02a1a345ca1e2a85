import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import { appConfig } from './api';
import { App } from './App';
import './styles.css';

appConfig().then(() => {
  createRoot(document.getElementById('root')!).render(
    <StrictMode>
      <App />
    </StrictMode>,
  );
});
